"""Bearer tokens and TLS on the real ``ratekeeper serve``: a surface with tokens refuses a
request without a known one (HTTP 401, gRPC UNAUTHENTICATED) and accepts a known one;
token files and certificates are read again on SIGHUP; TLS serves HTTPS and gRPC, and
with a client CA it takes only clients with a certificate signed by it. The certificates
are made for each test with the ``openssl`` command."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servers import wait_until

from .clients import OK, descriptor, envoy_request
from .conftest import Served

ADMIN_SECRET = "adm-0123456789abcdef0123456789"
DECISION_SECRET = "dec-0123456789abcdef0123456789"
ENVOY = """
domain: {uid}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 100}}
"""


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


# -- tokens ---------------------------------------------------------------------------


def test_an_admin_token_file_guards_the_admin_surface_only(serve: Callable[..., Served], tmp_path: Path) -> None:
    tokens = tmp_path / "admin.tokens"
    tokens.write_text(f"# the operators\n\nops:{ADMIN_SECRET}\n")
    served = serve(args=["--admin-token-file", str(tokens)])
    reset = {"rule": "items.list", "key": "k"}
    with httpx.Client(base_url=served.admin_url, timeout=5) as admin:
        missing = admin.post("/v1/reset", json=reset)
        assert 401 == missing.status_code
        assert "Bearer" == missing.headers["WWW-Authenticate"]
        assert "application/problem+json" == missing.headers["content-type"]
        assert "no bearer token" in missing.json()["detail"]
        wrong = admin.post("/v1/reset", json=reset, headers=bearer(ADMIN_SECRET[:-1] + "X"))
        assert 401 == wrong.status_code
        assert "does not know" in wrong.json()["detail"]
        assert 401 == admin.get("/metrics", headers={"Authorization": f"Basic {ADMIN_SECRET}"}).status_code
        assert 401 == admin.get("/no-such-route").status_code  # no token: the routes stay unknown
        assert 200 == admin.post("/v1/reset", json=reset, headers=bearer(ADMIN_SECRET)).status_code
        assert 200 == admin.get("/metrics", headers=bearer(ADMIN_SECRET)).status_code
        assert 200 == admin.get("/healthz").status_code  # probes carry no token
        doc = admin.get("/openapi.json", headers=bearer(ADMIN_SECRET)).json()
        assert [{"bearer": []}] == doc["security"]
    # the decision surface has no tokens of its own: open
    assert 200 == httpx.post(f"{served.url}/v1/check", json=reset, timeout=5).status_code
    audit = [e for e in served.events() if e.get("event") == "reset"]
    assert ["ops"] == [e["token"] for e in audit]
    assert ADMIN_SECRET not in served.log.read_text()


def test_decision_tokens_from_the_environment_guard_http_and_grpc(serve: Callable[..., Served], uid: str) -> None:
    served = serve(
        rules=[ENVOY.format(uid=uid)],
        env={"RATEKEEPER_DECISION_TOKENS": f"{DECISION_SECRET}\nedge:{DECISION_SECRET[::-1]}\n"},
    )
    body = {"domain": uid, "descriptors": [{"entries": [{"key": "user", "value": "u"}]}]}
    assert 401 == httpx.post(f"{served.url}/json", json=body, timeout=5).status_code
    assert 200 == httpx.post(f"{served.url}/json", json=body, headers=bearer(DECISION_SECRET), timeout=5).status_code
    assert (
        200 == httpx.post(f"{served.url}/json", json=body, headers=bearer(DECISION_SECRET[::-1]), timeout=5).status_code
    )
    request = envoy_request(uid, [descriptor(("user", "u"))])
    with grpc.insecure_channel(served.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ShouldRateLimit(request, timeout=5)
        assert grpc.StatusCode.UNAUTHENTICATED == refused.value.code()
        assert "authorization: Bearer" in str(refused.value.details())
        with pytest.raises(grpc.RpcError) as wrong:
            stub.ShouldRateLimit(request, timeout=5, metadata=[("authorization", "Bearer not-a-known-secret")])
        assert grpc.StatusCode.UNAUTHENTICATED == wrong.value.code()
        reply = stub.ShouldRateLimit(request, timeout=5, metadata=[("authorization", f"Bearer {DECISION_SECRET}")])
        assert OK == reply.overall_code
        # health checking answers without a token, as /healthz does
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health_pb2.HealthCheckResponse.SERVING == health.status


def test_a_token_file_is_read_again_on_sighup(serve: Callable[..., Served], tmp_path: Path) -> None:
    tokens = tmp_path / "admin.tokens"
    tokens.write_text(f"old:{ADMIN_SECRET}\n")
    served = serve(args=["--admin-token-file", str(tokens)])
    rotated = ADMIN_SECRET.replace("adm", "new")
    tokens.write_text(f"new:{rotated}\n")
    served.proc.send_signal(signal.SIGHUP)

    def rotated_in() -> bool:
        return 200 == httpx.get(f"{served.admin_url}/v1/rules", headers=bearer(rotated), timeout=2).status_code

    wait_until(rotated_in, 10, "the new token to be accepted")
    assert 401 == httpx.get(f"{served.admin_url}/v1/rules", headers=bearer(ADMIN_SECRET), timeout=5).status_code
    # a broken file on the next SIGHUP keeps the tokens in force, and says why
    tokens.write_text("short\n")
    served.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: any(e.get("event") == "tokens" and e.get("level") == "error" for e in served.events()),
        10,
        "the failed reload in the log",
    )
    assert rotated_in()


def test_a_token_too_short_to_be_safe_stops_the_start(serve: Callable[..., Served], tmp_path: Path) -> None:
    tokens = tmp_path / "admin.tokens"
    tokens.write_text("ops:hunter2\n")
    with pytest.raises(RuntimeError, match=r"line 1: the secret of 'ops' has 7 characters"):
        serve(args=["--admin-token-file", str(tokens)])


# -- TLS ------------------------------------------------------------------------------


@dataclass
class Pki:
    """A test CA, a server certificate for 127.0.0.1 signed by it, a client certificate,
    and a second CA with its own server certificate (the replacement)."""

    dir: Path
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_cert: Path
    other_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(name: str, cwd: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        cwd=cwd,
    )  # fmt: skip


def _make_leaf(name: str, ca: str, cwd: Path, ext: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=cwd,
    )  # fmt: skip


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (apt-get install openssl)")
    d = tmp_path / "pki"
    d.mkdir()
    server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    _make_ca("ca", d)
    _make_leaf("server", "ca", d, server_ext)
    _make_leaf("client", "ca", d, "extendedKeyUsage=clientAuth\n")
    _make_ca("other-ca", d)
    _make_leaf("other-server", "other-ca", d, server_ext)
    return Pki(
        d, d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
        d / "other-ca.pem", d / "other-server.pem", d / "other-server.key",
    )  # fmt: skip


def _context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def _https(served: Served, path: str = "/healthz") -> tuple[str, str]:
    return served.url.replace("http://", "https://") + path, served.admin_url.replace("http://", "https://") + path


def _grpc_health(target: str, credentials: grpc.ChannelCredentials) -> int:
    with grpc.secure_channel(target, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(reply.status)


def _tls_ready(ca: Path, cert: Path | None = None, key: Path | None = None) -> Callable[[Served], bool]:
    def ready(served: Served) -> bool:
        return 200 == httpx.get(_https(served)[0], verify=_context(ca, cert, key), timeout=1).status_code

    return ready


def test_tls_serves_https_on_both_surfaces_and_grpc_over_tls(serve: Callable[..., Served], pki: Pki) -> None:
    served = serve(args=["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)], ready=_tls_ready(pki.ca))
    decision, admin = _https(served)
    assert 200 == httpx.get(decision, verify=_context(pki.ca), timeout=5).status_code
    assert 200 == httpx.get(admin.replace("/healthz", "/metrics"), verify=_context(pki.ca), timeout=5).status_code
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on a TLS listener
        httpx.get(f"{served.url}/healthz", timeout=5)
    root = pki.ca.read_bytes()
    assert 1 == _grpc_health(served.grpc_target, grpc.ssl_channel_credentials(root))  # SERVING
    with pytest.raises(grpc.RpcError), grpc.insecure_channel(served.grpc_target) as channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    start = next(e for e in served.events() if e.get("event") == "start")
    assert start["http"] == served.url.replace("http://", "https://")


def test_a_client_ca_requires_client_certificates_on_http_and_grpc(serve: Callable[..., Served], pki: Pki) -> None:
    args = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-client-ca", str(pki.ca)]
    served = serve(args=args, ready=_tls_ready(pki.ca, pki.client_cert, pki.client_key))
    decision, admin = _https(served)
    for url in (decision, admin):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, verify=_context(pki.ca), timeout=5).raise_for_status()
        with_cert = _context(pki.ca, pki.client_cert, pki.client_key)
        assert 200 == httpx.get(url, verify=with_cert, timeout=5).status_code
    root = pki.ca.read_bytes()
    with pytest.raises(grpc.RpcError) as refused:
        _grpc_health(served.grpc_target, grpc.ssl_channel_credentials(root))
    assert grpc.StatusCode.UNAVAILABLE == refused.value.code()
    credentials = grpc.ssl_channel_credentials(root, pki.client_key.read_bytes(), pki.client_cert.read_bytes())
    assert 1 == _grpc_health(served.grpc_target, credentials)


def test_a_replaced_certificate_is_served_after_sighup(serve: Callable[..., Served], pki: Pki) -> None:
    cert, key = pki.dir / "served.pem", pki.dir / "served.key"
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    served = serve(args=["--tls-cert", str(cert), "--tls-key", str(key)], ready=_tls_ready(pki.ca))
    decision, admin = _https(served)
    other_root = pki.other_ca.read_bytes()
    with pytest.raises(httpx.HTTPError):  # a client that trusts only the new CA
        httpx.get(decision, verify=_context(pki.other_ca), timeout=5)
    shutil.copy(pki.other_cert, cert)
    shutil.copy(pki.other_key, key)
    served.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: 200 == httpx.get(decision, verify=_context(pki.other_ca), timeout=2).status_code,
        10,
        "the new certificate on the decision surface",
    )
    assert 200 == httpx.get(admin, verify=_context(pki.other_ca), timeout=5).status_code
    with pytest.raises(httpx.HTTPError):
        httpx.get(admin, verify=_context(pki.ca), timeout=5)
    assert 1 == _grpc_health(served.grpc_target, grpc.ssl_channel_credentials(other_root))
    assert any(e.get("event") == "tls" and e.get("reloaded") is True for e in served.events())
    # a key that does not match on the next SIGHUP: the certificate in force stays
    shutil.copy(pki.key, key)
    served.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: any(e.get("event") == "tls" and e.get("level") == "error" for e in served.events()),
        10,
        "the failed reload in the log",
    )
    assert 200 == httpx.get(decision, verify=_context(pki.other_ca), timeout=5).status_code


def test_the_store_api_takes_admin_tokens_and_keeps_each_tokens_rules_apart(
    serve: Callable[..., Served], tmp_path: Path, uid: str
) -> None:
    from ratekeeper import Limiter, Rule
    from ratekeeper.errors import StoreError

    tokens = tmp_path / "admin.tokens"
    tokens.write_text(f"fleet-a:{ADMIN_SECRET}\nfleet-b:{ADMIN_SECRET[::-1]}\n")
    configured = f'rules:\n  - name: {uid}.r\n    limits: ["1/minute"]\n'
    served = serve(rules=[configured], args=["--store-api", "--admin-token-file", str(tokens)])
    secrets = {}
    for name, secret in (("a", ADMIN_SECRET), ("b", ADMIN_SECRET[::-1])):
        secrets[name] = tmp_path / f"{name}.secret"
        secrets[name].write_text(secret + "\n")
    rule = Rule(f"{uid}.r", ["1/minute"])  # the configured rule's name, on purpose
    with (
        Limiter(f"{served.admin_url}/?token_file={secrets['a']}") as a,
        Limiter(f"{served.admin_url}/?token_file={secrets['b']}") as b,
    ):
        assert a.try_acquire(rule, "k").allowed
        assert not a.try_acquire(rule, "k").allowed
        assert b.try_acquire(rule, "k").allowed  # another token: another namespace
    # the configured rule of the same name shares nothing with them
    check = {"rule": f"{uid}.r", "key": "k"}
    assert 200 == httpx.post(f"{served.url}/v1/check", json=check, timeout=5).status_code
    with Limiter(served.admin_url) as anonymous, pytest.raises(StoreError, match="401"):
        anonymous.try_acquire(rule, "k")


def test_a_fleet_uses_the_service_as_its_store_over_tls_with_a_client_certificate_and_a_token(
    serve: Callable[..., Served], tmp_path: Path, pki: Pki, uid: str
) -> None:
    """The deployment docs/security.md describes: the store API on a TLS admin surface that
    requires client certificates and a token; a fleet's limiter reaches it with ``ca_file``,
    ``cert_file``, ``key_file`` and ``token_file``, and is refused without its certificate."""
    from ratekeeper import Limiter, Rule
    from ratekeeper.errors import StoreError

    tokens = tmp_path / "admin.tokens"
    tokens.write_text(f"fleet:{ADMIN_SECRET}\n")
    secret = tmp_path / "fleet.secret"
    secret.write_text(ADMIN_SECRET + "\n")
    args = ["--store-api", "--admin-token-file", str(tokens), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    args += ["--tls-client-ca", str(pki.ca)]
    served = serve(args=args, ready=_tls_ready(pki.ca, pki.client_cert, pki.client_key))
    base = served.admin_url.replace("http://", "https://")
    url = f"{base}/?token_file={secret}&ca_file={pki.ca}&cert_file={pki.client_cert}&key_file={pki.client_key}"
    rule = Rule(f"{uid}.fleet", ["2/minute"])
    with Limiter(url, on_error="raise") as limiter:
        assert [True, True, False] == [limiter.try_acquire(rule, "k").allowed for _ in range(3)]
    without_cert = f"{base}/?token_file={secret}&ca_file={pki.ca}"
    with Limiter(without_cert, on_error="raise") as limiter, pytest.raises(StoreError):
        limiter.try_acquire(rule, "k")
