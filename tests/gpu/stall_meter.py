"""stall_meter.py: the --stall meter of the PyTorch workloads (train.py,
infer.py), without torch so that its logic is tested on any machine.

The protocol of tests/workloads/workload.h: on SIGUSR2 the process writes
FILE.stall (temp + rename), the longest stall in seconds since the
previous SIGUSR2 ("0.934512\n"). Two clocks, the larger counts:

- a thread that wakes every 1 ms keeps the longest gap between two
  wake-ups: a CPU freeze (CRIU stops every thread; GIL hand-offs add up
  to a few ms);
- the main loop keeps the longest time between two completed steps less
  its fixed pause: a GPU block (the step waits for its kernels, and the
  driver's lock holds them); resolution about one step.

A GPU block shows only once the step it held up ends, which can be after
the SIGUSR2 that follows the unlock: so on SIGUSR2 the thread answers only
once the main loop has completed a step that ended after the signal
(meanwhile it goes on measuring its own gaps), or after ANSWER_WAIT_S
without one (a process whose loop has ended still answers, with what it
has). An answer thus comes at most about one step late.

SIGUSR2 must be blocked in every thread (the importer does it before torch
starts any) and is taken only by the meter's thread; without --stall it
stays pending and does nothing. Read it across leave-running checkpoints
only: across a kill and restore the gap is the time the process did not
exist.
"""

import signal
import threading
import time

ANSWER_WAIT_S = 10.0


def sigusr2_taken():
    """Whether SIGUSR2 was pending (it no longer is)."""
    return signal.sigtimedwait([signal.SIGUSR2], 0) is not None


class StallMeter:
    """--stall: the longest stall since the last SIGUSR2, answered once a
    step has ended after the signal (see the top). `path`: where the
    answers go, through write(path, text, sync=False) (the workload's
    temp + rename); `pause_s`: the main loop's fixed pause between steps;
    `clock`: monotonic, in seconds."""

    def __init__(self, path, pause_s, write, clock=time.monotonic,
                 answer_wait_s=ANSWER_WAIT_S):
        self.path = path
        self.pause_s = pause_s
        self.write = write
        self.clock = clock
        self.answer_wait_s = answer_wait_s
        self.lock = threading.Lock()
        self.longest = 0.0
        self.last_step = None
        self.steps_done = 0
        self.last_wake = None
        # While an answer waits for a step: (steps_done, the clock) when
        # the signal was taken.
        self.asked = None

    def step_done(self):
        """Main loop, after each step's wait for its kernels."""
        now = self.clock()
        with self.lock:
            if self.last_step is not None:
                self.longest = max(self.longest, now - self.last_step - self.pause_s)
            self.last_step = now
            self.steps_done += 1

    def wake(self, signalled=sigusr2_taken):
        """One wake-up of the meter's thread: counts the gap since the
        previous one, takes a SIGUSR2 (`signalled()`) unless an answer is
        already waiting. The longest stall to answer (and a new interval
        starts), or None while there is nothing to answer yet."""
        now = self.clock()
        with self.lock:
            if self.last_wake is not None:
                self.longest = max(self.longest, now - self.last_wake)
            self.last_wake = now
            if self.asked is None:
                if not signalled():
                    return None
                self.asked = (self.steps_done, now)
            steps_then, taken_at = self.asked
            if self.steps_done == steps_then and now - taken_at < self.answer_wait_s:
                return None
            self.asked = None
            longest, self.longest = self.longest, 0.0
            return longest

    def run(self):
        """The meter's thread."""
        self.last_wake = self.clock()
        while True:
            time.sleep(0.001)
            longest = self.wake()
            if longest is None:
                continue
            # No fsync: it is read on this machine. Written outside the lock
            # (the main loop must not wait for it); its time counts in the
            # next gap.
            self.write(self.path, "%.6f\n" % longest, sync=False)
