"""The HTTP side of the executor: the Flask app factory, the waitress server, configuration of
logging per request, Prometheus metrics, graceful shutdown and the routes (``api/``).

The only Flask-aware package. It may import every package below it (sessions, grading,
workspaces, sandbox) and the shared ``config`` and ``errors``; nothing imports it but the CLI.
"""
