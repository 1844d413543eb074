// The pause process holds a pod's namespaces. It runs as a constructor of the shim binary
// so that it never starts the Go runtime: no threads (setns(CLONE_NEWNET) needs a
// single-threaded process anyway) and next to no private memory per pod.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define READY_FD 3

// report_and_exit also ends an OCI pause (no READY_FD there): the write fails, the
// exit status tells.
static void report_and_exit(const char *msg)
{
	size_t len = strlen(msg);
	// Best effort: the parent treats a short or missing message as failure too.
	if (write(READY_FD, msg, len) < 0) {
	}
	close(READY_FD);
	_exit(1);
}

static void fail(const char *what, const char *arg, int err)
{
	char buf[1024];
	snprintf(buf, sizeof(buf), "%s %s: %s", what, arg, strerror(err));
	report_and_exit(buf);
}

static void join_netns(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fail("open netns", path, errno);
	if (setns(fd, CLONE_NEWNET) < 0)
		fail("setns", path, errno);
	close(fd);
}

// join_userns_of_netns joins the user namespace that owns the network namespace at
// path, becomes its root, and joins the network namespace. containerd creates a
// user-namespaced pod's network namespace inside the pod's user namespace (with a
// process it then kills), so that namespace lives on only as the owner of the netns.
static void join_userns_of_netns(const char *path)
{
	int netfd = open(path, O_RDONLY | O_CLOEXEC);
	if (netfd < 0)
		fail("open netns", path, errno);
	int userfd = ioctl(netfd, NS_GET_USERNS);
	if (userfd < 0)
		fail("NS_GET_USERNS", path, errno);
	if (setns(userfd, CLONE_NEWUSER) < 0)
		fail("setns to the user namespace owning", path, errno);
	close(userfd);
	// The shim's host ids are not mapped in the namespace; its root is (we hold every
	// capability in it after setns). The host's supplementary groups go where the
	// namespace allows setgroups; where it does not, they stay (unmapped, so they
	// grant nothing inside).
	if (setgroups(0, NULL) < 0 && errno != EPERM)
		fail("setgroups", "", errno);
	if (setresgid(0, 0, 0) < 0)
		fail("setresgid", "0", errno);
	if (setresuid(0, 0, 0) < 0)
		fail("setresuid", "0", errno);
	if (setns(netfd, CLONE_NEWNET) < 0)
		fail("setns", path, errno);
	close(netfd);
}

// unshare_and_fork creates the pod's other namespaces inside its user namespace (so
// that it owns them) and, for a new PID namespace, forks its init: a sibling of this
// process (CLONE_PARENT), so that the shim is its parent. This process reports the new
// pid on READY_FD ("pid:N\n") and exits; the child goes on only after that, so the
// shim always reads the pid before the child's own report.
static void unshare_and_fork(const char *flags_env)
{
	char *end;
	long flags = strtol(flags_env, &end, 10);
	if (*end != '\0' || flags < 0 || (flags & ~(long)(CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID)) != 0)
		fail("unshare flags", flags_env, EINVAL);
	if (flags != 0 && unshare((int)flags) < 0)
		fail("unshare", flags_env, errno);
	if ((flags & CLONE_NEWPID) == 0)
		return;
	int sync[2];
	if (pipe2(sync, O_CLOEXEC) < 0)
		fail("pipe", "", errno);
	long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
	if (pid < 0)
		fail("clone", "pid namespace init", errno);
	if (pid == 0) {
		char c;
		close(sync[1]);
		// EOF once the parent has reported the pid and exited.
		while (read(sync[0], &c, 1) < 0 && errno == EINTR) {
		}
		close(sync[0]);
		return;
	}
	char msg[32];
	int n = snprintf(msg, sizeof(msg), "pid:%ld\n", pid);
	if (write(READY_FD, msg, n) != n) {
		kill(pid, SIGKILL);
		_exit(1);
	}
	_exit(0);
}

// write_sysctl writes one "key=value" line. The shim validated keys already; the checks
// are repeated because this code writes below /proc/sys as root.
static void write_sysctl(char *line)
{
	char path[4096];
	char *eq = strchr(line, '=');
	if (eq == NULL || eq == line)
		fail("sysctl", line, EINVAL);
	*eq = '\0';
	const char *key = line, *value = eq + 1;
	if (strstr(key, "..") != NULL || strchr(key, '/') != NULL)
		fail("sysctl", key, EINVAL);
	int n = snprintf(path, sizeof(path), "/proc/sys/%s", key);
	if (n < 0 || (size_t)n >= sizeof(path))
		fail("sysctl", key, ENAMETOOLONG);
	for (char *p = path + strlen("/proc/sys/"); *p; p++)
		if (*p == '.')
			*p = '/';
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fail("sysctl", key, errno);
	size_t len = strlen(value);
	ssize_t w = write(fd, value, len);
	if (w < 0)
		fail("sysctl", key, errno);
	if ((size_t)w != len)
		fail("sysctl short write", key, EIO);
	if (close(fd) < 0)
		fail("sysctl", key, errno);
}

static void apply_sysctls(const char *env)
{
	char *copy = strdup(env);
	if (copy == NULL)
		fail("sysctl", "", ENOMEM);
	char *save = NULL;
	for (char *line = strtok_r(copy, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
		write_sysctl(line);
	free(copy);
}

static void set_oom_score_adj(const char *value)
{
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fail("open", "/proc/self/oom_score_adj", errno);
	if (write(fd, value, strlen(value)) < 0)
		fail("write oom_score_adj", value, errno);
	close(fd);
}

// take_label moves the process into the pod's SELinux label (setcon: a dynamic
// transition) once the namespaces, which need the shim's domain, are in place. A
// refusal is not fatal: the pause keeps the shim's domain, and the shim, which reads
// the label back, says so.
static void take_label(const char *label)
{
	int fd = open("/proc/self/attr/current", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	// libselinux's setcon writes the terminating NUL too.
	if (write(fd, label, strlen(label) + 1) < 0) {
	}
	close(fd);
}

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

// As PID 1 of the pod's PID namespace the pause process inherits every orphan in it;
// reaping them here keeps zombies from piling up.
static void on_chld(int sig)
{
	(void)sig;
	int saved = errno;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

static void install_handlers(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_term;
	if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
		fail("sigaction", "SIGTERM", errno);
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
	if (sigaction(SIGCHLD, &sa, NULL) < 0)
		fail("sigaction", "SIGCHLD", errno);
	sigset_t none;
	sigemptyset(&none);
	if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
		fail("sigprocmask", "", errno);
}

static void pause_main(void)
{
	const char *v;

	prctl(PR_SET_NAME, "crisp-pause", 0, 0, 0);
	// First, so that a child forked below inherits it, and before the pod's label,
	// in which the process may no longer be written to by the shim's domain.
	if ((v = getenv("_CRISP_OOM_SCORE_ADJ")) != NULL && *v)
		set_oom_score_adj(v);
	// Namespaces first: sysctls resolve against the writer's namespaces.
	if ((v = getenv("_CRISP_USERNS_OF_NETNS")) != NULL && *v)
		join_userns_of_netns(v);
	else if ((v = getenv("_CRISP_NETNS")) != NULL && *v)
		join_netns(v);
	// As the user namespace's root (joined above, or made with this process): the
	// namespaces made now are owned by it, and their files by its root.
	if ((v = getenv("_CRISP_UNSHARE")) != NULL && *v)
		unshare_and_fork(v);
	if ((v = getenv("_CRISP_HOSTNAME")) != NULL && *v)
		if (sethostname(v, strlen(v)) < 0)
			fail("sethostname", v, errno);
	if ((v = getenv("_CRISP_SYSCTLS")) != NULL && *v)
		apply_sysctls(v);
	if ((v = getenv("_CRISP_SELINUX_LABEL")) != NULL && *v)
		take_label(v);
	// Handlers go in before readiness is reported: a PID-namespace init only receives
	// the signals it handles, so a stop right after start must already find them.
	install_handlers();
	if (write(READY_FD, "ok", 2) != 2)
		_exit(1);
	close(READY_FD);
	for (;;)
		pause();
}

// oci_pause_main is the pause process of a pod run by a task-only shim: the binary is
// the process of an OCI container whose runtime already made its namespaces, hostname
// and sysctls, and nobody waits on a readiness fd.
static void oci_pause_main(void)
{
	prctl(PR_SET_NAME, "crisp-pause", 0, 0, 0);
	install_handlers();
	for (;;)
		pause();
}

__attribute__((constructor)) static void crisp_pause_init(void)
{
	const char *v = getenv("_CRISP_PAUSE");
	if (v == NULL)
		return;
	if (strcmp(v, "1") == 0)
		pause_main();
	if (strcmp(v, "oci") == 0)
		oci_pause_main();
}
