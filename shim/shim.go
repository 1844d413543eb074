package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/crisp-runtime/crisp/api/containerd/types"
	"github.com/crisp-runtime/crisp/internal/version"
)

// RuntimeName is what -info reports as the runtime's name.
const RuntimeName = "crisp-shim-runc"

// Files the shim keeps in the bundle directory.
const (
	// PidFile holds the pid of the serving shim.
	PidFile = "shim.pid"
	// LogFile receives the serving shim's stdout and stderr (JSON log lines).
	LogFile = "shim.log"
	// AddressFile holds the socket address, so `delete` finds the socket even when it
	// was placed in a socket_dir it is not told about.
	AddressFile = "shim.address"
)

// DefaultSocketDir holds the shims' sockets unless BootstrapParams.socket_dir says
// otherwise. It is short on purpose: see maxSocketPath.
const DefaultSocketDir = "/run/crisp/s"

// maxSocketPath is the longest unix socket path that works everywhere (sun_path is 108
// bytes on Linux, 104 on the BSDs; containerd uses the same limit).
const maxSocketPath = 106

// maxStdin bounds what `start` reads from stdin, as containerd's shims do.
const maxStdin = 10 << 20

// Flags are the command-line values every mode of the binary understands.
type Flags struct {
	Namespace     string
	Address       string
	PublishBinary string
	ID            string
	Bundle        string
	Debug         bool
}

// SocketPath is where the shim for (address, namespace, id) listens: the name hashes
// all three so that shims of different containerd instances or namespaces never clash.
func SocketPath(dir, address, namespace, id string) string {
	sum := sha256.Sum256([]byte(address + "/" + namespace + "/" + id))
	return filepath.Join(dir, hex.EncodeToString(sum[:]))
}

func bundleDir(flag string) (string, error) {
	dir := flag
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", fmt.Errorf("bundle: %w", err)
		}
		dir = wd
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("bundle %q: %w", dir, err)
	}
	return abs, nil
}

// WriteVersion prints the human-readable version (-v, -version, --version).
func WriteVersion(w io.Writer) error {
	_, err := fmt.Fprintf(w, "%s (%s):\n  Version:    %s\n  Go version: %s\n", filepath.Base(os.Args[0]), version.Name, version.Version, runtime.Version())
	return err
}

// Info prints the protobuf RuntimeInfo that containerd asks for with -info, with the
// shim's OCI features (Features). Runtime options arriving on stdin are read and
// ignored: the shim has none yet.
func Info(stdin io.Reader, stdout io.Writer) error {
	if f, ok := stdin.(*os.File); !ok || !isTerminal(f) {
		if _, err := io.Copy(io.Discard, io.LimitReader(stdin, maxStdin)); err != nil {
			return fmt.Errorf("read runtime options: %w", err)
		}
	}
	feat, err := featuresAny()
	if err != nil {
		return err
	}
	data, err := proto.Marshal(&types.RuntimeInfo{
		Name:     RuntimeName,
		Version:  &types.RuntimeVersion{Version: version.Version},
		Features: feat,
	})
	if err != nil {
		return fmt.Errorf("encode runtime info: %w", err)
	}
	_, err = stdout.Write(data)
	return err
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
