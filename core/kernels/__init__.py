"""The quantized kernels: C products over GGUF's quantized layouts and a whole
decoder stack in one call, and their Python side.

build    which instruction sets, which compiler, building, caching and loading the
         library (kernel_isa, runnable_isas, amx_rows, use_build)
layouts  the GGUF layouts (Q4_1's form, Q4_K, Q6_K, Q8_0; Q5_0 read onto Q6_K's
         grid): reading them from a file, fitting any weight, packing
linear   the nn modules (QuantLinear and a subclass per layout) and quant_mm
stack    the decoder stack's binding (DecoderStack)
csrc/    the C sources (quant_gemm.c/.h, decoder_stack.c)

What the kernels gain and cost: docs/performance.md.
"""
