/*
 * The kernels on the GPU's global timer, in one place for both libraries. SPIN: a one-parameter kernel that holds
 * its stream for ns nanoseconds of %globaltimer; the probe core times it (semantics: a copy behind queued GPU
 * work), the emulator queues it as a collective's device-side charge (emu/collective.c). STAMP: one thread
 * writes %globaltimer (ns) to the 8 bytes at its parameter when its stream reaches it: GPU time without CUDA
 * events, which are unreliable under CC (TensorRT PR #4740), as TensorRT-LLM and FlashInfer time there
 * (ccbridge/gputimer.py). PTX text, JIT-compiled by the driver for whatever GPU it meets, so neither library
 * needs CUDA to build.
 */
#ifndef CCB_SPIN_PTX_H
#define CCB_SPIN_PTX_H
#define CCB_PTX_HEADER ".version 7.0\n.target sm_75\n.address_size 64\n"
#define CCB_PTX_SPIN(name)                                                   \
    ".visible .entry " name "(.param .u64 " name "_ns)\n{\n"                 \
    "\t.reg .pred %p<2>;\n\t.reg .b64 %rd<6>;\n"                             \
    "\tld.param.u64 %rd1, [" name "_ns];\n"                                  \
    "\tmov.u64 %rd2, %globaltimer;\n"                                        \
    "$L_loop:\n\tmov.u64 %rd3, %globaltimer;\n"                              \
    "\tsub.s64 %rd4, %rd3, %rd2;\n"                                          \
    "\tsetp.lt.u64 %p1, %rd4, %rd1;\n"                                       \
    "\t@%p1 bra $L_loop;\n\tret;\n}\n"
#define CCB_PTX_STAMP(name)                                                  \
    ".visible .entry " name "(.param .u64 " name "_at)\n{\n"                 \
    "\t.reg .b64 %rd<4>;\n"                                                  \
    "\tld.param.u64 %rd1, [" name "_at];\n"                                  \
    "\tcvta.to.global.u64 %rd2, %rd1;\n"                                     \
    "\tmov.u64 %rd3, %globaltimer;\n"                                        \
    "\tst.global.u64 [%rd2], %rd3;\n\tret;\n}\n"
#endif
