package spec

import (
	"path"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// defaultPathEnv is the PATH a container gets when its image sets none (containerd's
// oci.WithDefaultPathEnv, itself docker's default).
const defaultPathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// processArgs merges the CRI command/args with the image's Entrypoint/Cmd exactly as
// containerd's WithProcessArgs does (which follows docker's commit logic):
//   - CRI command set: it replaces the Entrypoint and the image Cmd is never used, so
//     CRI args are the only arguments (kubelet: "command" overrides ENTRYPOINT and
//     drops CMD).
//   - CRI command unset: CRI args, if any, replace the Cmd, behind the Entrypoint.
//   - An Entrypoint of exactly [""] means "no entrypoint" (docker's ENTRYPOINT []).
//   - A CRI command that is set but empty ([]string{} from a Go caller) is not nil:
//     like containerd, it then drops the Entrypoint but still falls back to Cmd.
func processArgs(cfg *runtime.ContainerConfig, img ocispec.ImageConfig) ([]string, error) {
	command, args := cfg.GetCommand(), cfg.GetArgs()
	if len(command) == 0 {
		if len(args) == 0 {
			args = append([]string{}, img.Cmd...)
		}
		if command == nil {
			if len(img.Entrypoint) != 1 || img.Entrypoint[0] != "" {
				command = append([]string{}, img.Entrypoint...)
			}
		}
	}
	if len(command) == 0 && len(args) == 0 {
		return nil, invalidf("no command to run: the container config sets no command or args and the image has no ENTRYPOINT or CMD")
	}
	return append(append([]string{}, command...), args...), nil
}

// processEnv builds the environment in containerd's order: PATH default, TERM for a
// tty, HOSTNAME, then the image's env, then the CRI envs, each later entry replacing an
// earlier one with the same key (and an entry without "=" unsetting it).
func processEnv(cfg *runtime.ContainerConfig, img ocispec.ImageConfig, hostname string) ([]string, error) {
	env := []string{defaultPathEnv}
	if cfg.GetTty() {
		env = append(env, "TERM=xterm")
	}
	env = replaceOrAppendEnv(env, []string{"HOSTNAME=" + hostname})
	env = replaceOrAppendEnv(env, img.Env)
	var cri []string
	for _, kv := range cfg.GetEnvs() {
		if kv.GetKey() == "" || strings.Contains(kv.GetKey(), "=") {
			return nil, invalidf("env %q: a variable name must be non-empty and contain no '='", kv.GetKey())
		}
		cri = append(cri, kv.GetKey()+"="+string(kv.GetValue()))
	}
	return replaceOrAppendEnv(env, cri), nil
}

// replaceOrAppendEnv is containerd's replaceOrAppendEnvValues: overrides replace the
// defaults by key, new keys are appended, and a bare "KEY" removes KEY.
func replaceOrAppendEnv(defaults, overrides []string) []string {
	index := make(map[string]int, len(defaults))
	out := make([]string, 0, len(defaults)+len(overrides))
	for _, e := range defaults {
		k, _, _ := strings.Cut(e, "=")
		index[k] = len(out)
		out = append(out, e)
	}
	for _, e := range overrides {
		k, _, ok := strings.Cut(e, "=")
		i, exists := index[k]
		switch {
		case !ok && exists:
			out[i] = ""
		case !ok:
		case exists:
			out[i] = e
		default:
			index[k] = len(out)
			out = append(out, e)
		}
	}
	kept := out[:0]
	for _, e := range out {
		if e != "" {
			kept = append(kept, e)
		}
	}
	return kept
}

// workingDir is the CRI working_dir, else the image's WorkingDir, else "/". The CRI's
// must be absolute (runc refuses a relative cwd); an image's relative WorkingDir is
// taken relative to "/", which is what docker does when it builds one.
func workingDir(cfg *runtime.ContainerConfig, img ocispec.ImageConfig) (string, error) {
	if wd := cfg.GetWorkingDir(); wd != "" {
		if !path.IsAbs(wd) {
			return "", invalidf("working_dir %q must be an absolute path", wd)
		}
		return path.Clean(wd), nil
	}
	if img.WorkingDir != "" {
		return path.Join("/", img.WorkingDir), nil
	}
	return "/", nil
}
