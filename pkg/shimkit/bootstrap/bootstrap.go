// Package bootstrap implements the modes of a shim binary other than serving, as
// containerd's runtime-v2 protocol defines them: `start` (BootstrapParams on stdin, or
// the legacy flags and environment; one serving shim per id, re-executed with its
// listening socket as fd 3 in a new session), `delete`'s socket removal and
// DeleteResponse, `-info` and the version. A shim calls Start, Listener, RemoveSocket,
// WriteDeleteResponse and WriteInfo from its main; the serving itself is the shim's.
package bootstrap

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	"github.com/crisp-runtime/crisp/api/containerd/types"
)

// Files the kit keeps in the bundle directory.
const (
	// PidFile holds the pid of the serving shim.
	PidFile = "shim.pid"
	// LogFile receives the serving shim's stdout and stderr.
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

// listenerFD is where `start` hands the listening socket to the serving shim.
const listenerFD = 3

// Flags are the command-line values every mode of a shim binary understands
// (containerd's -namespace, -address, -publish-binary, -id, -bundle, -debug).
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

// BundleDir is the absolute bundle directory: the -bundle flag, else the working
// directory (containerd starts shims in the bundle).
func BundleDir(flag string) (string, error) {
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

// ValidID reports whether id can name a shim: an alphanumeric, then up to 127 of
// [A-Za-z0-9_.-]. It becomes part of socket, cgroup and unit names.
func ValidID(id string) bool {
	if id == "" || len(id) > 128 || !isAlnum(id[0]) {
		return false
	}
	for i := range len(id) {
		if c := id[i]; !isAlnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// WriteVersion prints the human-readable version (-v, -version, --version) of the
// binary, which belongs to the program called name.
func WriteVersion(w io.Writer, name, version string) error {
	_, err := fmt.Fprintf(w, "%s (%s):\n  Version:    %s\n  Go version: %s\n", filepath.Base(os.Args[0]), name, version, runtime.Version())
	return err
}

// WriteInfo prints the protobuf RuntimeInfo containerd asks for with -info: the
// runtime's name and version and, when not nil, its OCI features document. Runtime
// options arriving on stdin are read and ignored.
func WriteInfo(stdin io.Reader, stdout io.Writer, name, version string, features *anypb.Any) error {
	if f, ok := stdin.(*os.File); !ok || !isTerminal(f) {
		if _, err := io.Copy(io.Discard, io.LimitReader(stdin, maxStdin)); err != nil {
			return fmt.Errorf("read runtime options: %w", err)
		}
	}
	data, err := proto.Marshal(&types.RuntimeInfo{
		Name:     name,
		Version:  &types.RuntimeVersion{Version: version},
		Features: features,
	})
	if err != nil {
		return fmt.Errorf("encode runtime info: %w", err)
	}
	_, err = stdout.Write(data)
	return err
}

// Exit is how a dead shim's sandbox ended, as `delete` reports it.
type Exit struct {
	Pid      uint32
	Status   uint32
	ExitedAt time.Time
}

// WriteDeleteResponse prints the protobuf task DeleteResponse `delete` answers with.
func WriteDeleteResponse(w io.Writer, exit Exit) error {
	data, err := proto.Marshal(&taskapi.DeleteResponse{
		Pid:        exit.Pid,
		ExitStatus: exit.Status,
		ExitedAt:   timestamppb.New(exit.ExitedAt),
	})
	if err != nil {
		return fmt.Errorf("encode delete response: %w", err)
	}
	_, err = w.Write(data)
	return err
}

// RemoveSocket removes a dead shim's socket: the one named in the bundle, or else the
// one the flags point to in the default socket dir.
func RemoveSocket(f Flags, bundle string) error {
	var path string
	if data, err := os.ReadFile(filepath.Join(bundle, AddressFile)); err == nil {
		path = strings.TrimPrefix(strings.TrimSpace(string(data)), "unix://")
	} else if f.ID != "" {
		ns := firstNonEmpty(f.Namespace, os.Getenv("NAMESPACE"), "default")
		path = SocketPath(DefaultSocketDir, firstNonEmpty(f.Address, os.Getenv("GRPC_ADDRESS")), ns, f.ID)
	}
	if path == "" || !filepath.IsAbs(path) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove socket: %w", err)
	}
	return nil
}

// Listener is the listening socket `start` handed the serving shim (fd 3).
func Listener() (net.Listener, error) {
	var st unix.Stat_t
	if err := unix.Fstat(listenerFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("no listening socket on fd %d: run `%s start` instead", listenerFD, filepath.Base(os.Args[0]))
	}
	f := os.NewFile(listenerFD, "listener")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("listener on fd %d: %w", listenerFD, err)
	}
	return l, nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
