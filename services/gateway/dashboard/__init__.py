"""The dashboard: public HTML pages and small scripts that call the public /v1 API with the user's key."""
