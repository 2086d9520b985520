"""The exporter's and the webhook's HTTP side, on aiohttp.

``connections`` admits connections (a cap, the first-request timeout, TLS from the web
configuration), ``webconfig`` reads an exporter-toolkit web configuration file (TLS, client
certificates, basic auth, rate limit, response headers), ``server`` serves a table of routes on
aiohttp behind both and writes each response within a deadline.
"""
