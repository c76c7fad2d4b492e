"""Weight-only quantized linear layers on torch's own packed ops, and the function that applies them.

int8.py         int8, one scale per output row          aten._weight_int8pack_mm (CPU, CUDA)
int4.py         int4, groups of 32, scale + zero point  aten._weight_int4pack_mm(_for_cpu)
fp8.py          e4m3, row-wise scales                   torch._scaled_mm (CUDA sm_89+), or emulated
linear.py       QuantLinear: a kernel + bias (+ the row-parallel all_reduce)
gguf_blocks.py  a GGUF file's Q4_0/Q4_1/Q8_0 blocks -> kernel inputs, no second rounding
apply.py        quantize_model(model, mode, raw=None): which layers become what
memory.py       bytes per quantized weight, for `conveyor plan`
"""

from engine.quant.apply import MODES, QuantSummary, quantize_model, weight_bytes

__all__ = ["MODES", "QuantSummary", "quantize_model", "weight_bytes"]
