/* Loaded by the CUDA driver during cuInit when CUDA_INJECTION64_PATH names it: prints which
 * thread initialised the driver, its native stack, and (SIGUSR1, which a Python process turns into
 * faulthandler's dump of every thread's Python stack) where the interpreter was at that moment.
 * Build: gcc -shared -fPIC -O1 -o libcuinit_trace.so cuinit_trace.c */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int InitializeInjection(void) {
  char line[160];
  int n = snprintf(line, sizeof line, "cuinit-trace: cuInit in pid %d, thread %ld (main thread: %s)\n",
                   (int)getpid(), (long)syscall(SYS_gettid),
                   syscall(SYS_gettid) == getpid() ? "yes" : "no");
  (void)!write(2, line, (size_t)n);
  void *frames[64];
  int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, 2);
  raise(SIGUSR1);
  return 1;
}
