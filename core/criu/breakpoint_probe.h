// Whether ptrace hardware breakpoints fire on this machine.
//
// CRIU stops a task leaving its parasite (dump) or restorer (restore) code
// at the final sigreturn with a hardware breakpoint. Some virtual machines
// (Firecracker guests among them) accept the debug registers and never
// fire them: CRIU then waits forever, the tree frozen. CRIU's
// FI_NO_BREAKPOINTS (CRIU_FAULT=130) makes it trace system calls up to the
// sigreturn instead, which works everywhere but costs two ptrace stops per
// system call: a restore of a 2 GiB process took 7 s instead of 1.5 s.
// So gpuckpt asks the machine once, the way CRIU sets its breakpoint, and
// turns breakpoints off only where they do not fire.
//
// Thread-safe: the probe runs once per process (about a millisecond where
// breakpoints work, at most about a second where they do not).
#ifndef GPUCKPT_CORE_CRIU_BREAKPOINT_PROBE_H_
#define GPUCKPT_CORE_CRIU_BREAKPOINT_PROBE_H_

namespace gpuckpt {

// false only when a breakpoint was accepted and did not fire: then CRIU
// must run with CRIU_FAULT=130. true where it fired, and where it could not
// be set (CRIU then falls back to tracing system calls by itself) or this
// is not x86-64.
bool HardwareBreakpointsFire();

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CRIU_BREAKPOINT_PROBE_H_
