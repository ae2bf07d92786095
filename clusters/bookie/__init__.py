"""The bookie: `python -m clusters.node CONFIG.json` with role "bookie" runs server.serve()."""
