"""arbench: linear-attention feature maps benchmarked on multi-query associative recall."""
