// The benchmarks P1..P7, P10, P11, P16 and the in-process half of P12 of bench/README.md and the child
// processes some of them start. Each RunPn records its samples through ctx.rec.
#pragma once

#include <string>
#include <vector>

#include "bench/common.h"

namespace tsar::bench {

// Writes DIR/many.tsar and DIR/many.safetensors: the same 100,000 small
// tensors (models.h ManyName/ManyShape), as tsar and as safetensors.
void GenerateMany(const std::string& dir);

void RunP1OpenBind(const Context& ctx);
void RunP2FirstOutput(const Context& ctx);
void RunP3Memory(const Context& ctx);
void RunP4Cold(const Context& ctx);
void RunP5Index(const Context& ctx);
void RunP6Pack(const Context& ctx);
void RunP7Verify(const Context& ctx);
void RunP10Layers(const Context& ctx);
void RunP11HotSwap(const Context& ctx);
void RunP12Api(const Context& ctx);  // with bench/p12_scale.py
void RunP16Staging(const Context& ctx);

// Child processes (started by this same executable):
//   child-first-output MODE SIDE DATA  P2: load resnet18 one way, run one
//                                  forward on 1x3xSIDExSIDE, print the phase
//                                  times; MODE tsar-cpp, pickle-cpp, tsar-ts
//                                  or jit.
//   child-hold MODE DATA           P3: hold the 512 MiB model (MODE tsar,
//                                  pickle, jit or none), print "ready", wait
//                                  for EOF on stdin.
int ChildFirstOutput(const std::vector<std::string>& args);
//   child-hold-archive ARCHIVE     P10: bind ARCHIVE (a layer or a full
//                                  archive of the stack), run it, print
//                                  "ready", wait for EOF on stdin.
int ChildHold(const std::vector<std::string>& args);
int ChildHoldArchive(const std::vector<std::string>& args);

}  // namespace tsar::bench
