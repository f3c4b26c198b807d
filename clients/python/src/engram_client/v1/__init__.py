"""Generated from proto/engram/v1 by scripts/gen-clients; do not edit."""
