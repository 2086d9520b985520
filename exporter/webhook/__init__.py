"""``ccl-exporter webhook``: the mutating admission webhook that turns on what detection needs.

``body`` reads the request body within the bounds of what an API server sends; ``podspec`` reads
the pod in it without trusting its shape; ``admission`` is the decision, pure (an AdmissionReview
v1 request and a ``WebhookConfig`` in, the AdmissionReview response with one JSONPatch out);
``metrics`` counts every decision on the webhook's own registry; ``serving`` serves ``POST /mutate``
over HTTPS. Its command line is ``exporter.commands.webhook``.
"""
