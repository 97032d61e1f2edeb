"""`bf16`: the identity quantizer. Every token stays in the model dtype; it must reproduce the stock model."""
from oscar.quantizer import KVQuantizer


class BF16(KVQuantizer):
    name = "bf16"
