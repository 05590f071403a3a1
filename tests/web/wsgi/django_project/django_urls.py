"""URLs of the test Django project."""

from __future__ import annotations

from django.urls import path

from web.wsgi.django_project import django_views as views

urlpatterns = [
    path("health", views.health),
    path("items/<str:user>", views.items),
    path("aitems/<str:user>", views.aitems),
    path("fail/<int:code>", views.fail),
    path("boom", views.boom),
    path("exempt/<path:rest>", views.exempt),
    path("header", views.header),
    path("ip", views.ip),
    path("me", views.me),
    path("ame", views.ame),
    path("stream/<int:n>", views.stream),
    path("r/<str:x>", views.route),
    path("mode", views.mode),
    path("metrics", views.metrics),
    path("login", views.login),
    path("kw/<str:user>", views.kw),
    path("rl/block", views.rl_block),
    path("rl/soft", views.rl_soft),
    path("rl/login", views.rl_login),
    path("rl/shared-sync", views.rl_shared_sync),
    path("rl/shared-async", views.rl_shared_async),
    path("rl/asoft", views.rl_asoft),
]
