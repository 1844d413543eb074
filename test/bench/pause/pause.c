/* The sandbox process of containerd's pods in `make bench`: what Kubernetes' pause
 * image runs (hold the namespaces, reap orphans, exit on SIGINT/SIGTERM), built here
 * with gcc -static because no container registry is reachable from this machine. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void bye(int sig) { _exit(sig == SIGINT || sig == SIGTERM ? 0 : 2); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction sa = {0};
	sa.sa_handler = bye;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	for (;;)
		pause();
}
