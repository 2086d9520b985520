"""A small HTTP/1.1 server on asyncio for the exporter's and the webhook's endpoints.

``messages`` parses requests and writes responses (pure), ``guard`` bounds connections and
their idle time, ``webconfig`` reads an exporter-toolkit web configuration file (TLS, client
certificates, basic auth, response headers), ``server`` ties them to sockets.
"""
