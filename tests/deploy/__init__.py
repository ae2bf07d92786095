"""Tests of clusters.deploy (the deployment backends)."""
