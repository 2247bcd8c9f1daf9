/* A command that keeps the sandbox's PID 1 busy reaping (x86_64 Linux; built by the test
 * `sandbox::a_command_that_keeps_pid_1_reaping_still_ends_at_its_timeout`).
 *
 * usage: reap_storm LIVE BACKLOG DURATION_MS PRODUCERS — exec'd by the shell, so that it is a
 * direct child of PID 1. It makes LIVE paused children of PID 1 (clone with CLONE_PARENT, and
 * CLONE_VM: no copy of memory), which every `wait` of PID 1 walks, then PRODUCERS processes
 * that each keep BACKLOG children of PID 1 that have exited waiting to be reaped, until
 * DURATION_MS have passed. Found by the attack pass of 2026-12-07: PID 1 reaped without end
 * and never saw keel close the call's lifeline. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* clone(flags) whose child, sharing this memory, never returns: it exits at once (`exits`) or
 * pauses for good. Raw, so that the child touches no stack. */
static long clone_child(long flags, int exits) {
    long ret;
    register long r10 asm("r10") = 0;
    register long r8 asm("r8") = 0;
    if (exits)
        asm volatile("syscall\n\ttest %%rax,%%rax\n\tjnz 1f\n\tmov $60,%%eax\n\txor %%edi,%%edi\n"
                     "\tsyscall\n1:\n"
                     : "=a"(ret)
                     : "0"(56L), "D"(flags), "S"(0L), "d"(0L), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    else
        asm volatile("syscall\n\ttest %%rax,%%rax\n\tjnz 1f\n2:\n\tmov $34,%%eax\n\tsyscall\n"
                     "\tjmp 2b\n1:\n"
                     : "=a"(ret)
                     : "0"(56L), "D"(flags), "S"(0L), "d"(0L), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    int live = atoi(argv[1]), backlog = atoi(argv[2]), producers = atoi(argv[4]);
    double end = now() + atoi(argv[3]) / 1000.0;
    long flags = CLONE_VM | CLONE_PARENT | SIGCHLD;
    for (int i = 0; i < live; i++)
        if (clone_child(flags, 0) < 0) break;
    for (int i = 1; i < producers; i++)
        if (syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0) == 0) break;
    pid_t *queue = calloc(backlog, sizeof(pid_t));
    int head = 0, count = 0;
    while (now() < end) {
        while (count > 0 && kill(queue[head], 0) == -1 && errno == ESRCH) {
            head = (head + 1) % backlog;
            count--;
        }
        if (count < backlog) {
            long pid = clone_child(flags, 1);
            if (pid > 0) queue[(head + count++) % backlog] = pid;
            else usleep(1000);
        } else {
            sched_yield();
        }
    }
    return 0;
}
