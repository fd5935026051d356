/* LD_PRELOAD'ed: on SIGSEGV/SIGABRT print the crashing thread's name and native backtrace to
 * stderr (no gdb on the GPU machine; Python's faulthandler is off by the end of finalization).
 * gcc -O0 -g -shared -fPIC segv_bt.c -o segv_bt.so -ldl -rdynamic */
#define _GNU_SOURCE
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>

static void on_sig(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char name[32] = "?";
    pthread_getname_np(pthread_self(), name, sizeof name);
    char line[256];
    int n = snprintf(line, sizeof line, "\n*** segv_bt: signal %d at address %p in thread '%s' (tid %ld)\n", sig,
                     si ? si->si_addr : NULL, name, (long)gettid());
    write(2, line, n);
    void *bt[64];
    int k = backtrace(bt, 64);
    for (int j = 0; j < k; j++) {
        Dl_info info;
        if (dladdr(bt[j], &info) && info.dli_fname) {
            n = snprintf(line, sizeof line, "  #%d %s (%s+0x%lx)\n", j, info.dli_sname ? info.dli_sname : "?",
                         info.dli_fname, (unsigned long)((char *)bt[j] - (char *)info.dli_fbase));
        } else {
            n = snprintf(line, sizeof line, "  #%d %p\n", j, bt[j]);
        }
        write(2, line, n);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sig;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}
