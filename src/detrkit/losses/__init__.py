"""Hungarian matching and the detection losses computed from matched outputs."""
