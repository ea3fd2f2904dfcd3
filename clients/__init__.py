"""What job scripts import: the CLI (and, later, the HTTP client and the torch side). Wire models only."""
