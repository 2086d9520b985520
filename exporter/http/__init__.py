"""The exporter's and the webhook's HTTP side, on aiohttp.

``connections`` admits connections (a cap, the first-request timeout, TLS from the web
configuration), ``webconfig`` reads an exporter-toolkit web configuration file (TLS, client
certificates, basic auth, rate limit, response headers) as exporter-toolkit does, with
``goyaml`` (YAML into typed fields as Go's yaml.v2) and ``openssl_hooks`` (what Python's ssl
does not expose), ``access`` checks basic auth and the rate limit, ``server`` serves a table of
routes on aiohttp behind all of them and writes each response within a deadline.
"""
