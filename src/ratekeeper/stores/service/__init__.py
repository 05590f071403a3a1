"""The ratekeeper service as a store (``http://host:8080``): a fleet without Redis or
PostgreSQL shares one ``ratekeeper serve``. ``sansio.py`` holds the wire, both ends."""
