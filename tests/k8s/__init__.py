"""Tests of the Kubernetes backend against a test API server that speaks the real wire protocol."""
