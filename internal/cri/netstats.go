package cri

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// defaultInterface is the pod interface CNI creates (crisp passes eth0 to CNI ADD).
const defaultInterface = "eth0"

// netIface is one interface's counters from /proc/<pid>/net/dev.
type netIface struct {
	name                         string
	rxBytes, rxPackets, rxErrors uint64
	rxDropped                    uint64
	txBytes, txPackets, txErrors uint64
	txDropped                    uint64
}

// readNetDev reads the interface counters of the network namespace pid lives in:
// /proc/<pid>/net/dev is the per-namespace view, so no setns (and no thread locked
// into the pod's namespace) is needed. Loopback is left out, as cAdvisor does.
func readNetDev(pid int) ([]netIface, time.Time, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	at := time.Now()
	if err != nil {
		return nil, at, fmt.Errorf("read network counters: %w", err)
	}
	ifaces, err := parseNetDev(data)
	return ifaces, at, err
}

// parseNetDev parses the format of /proc/net/dev: two header lines, then
// "name: rx bytes packets errs drop fifo frame compressed multicast tx bytes packets
// errs drop fifo colls carrier compressed".
func parseNetDev(data []byte) ([]netIface, error) {
	var out []netIface
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 0; sc.Scan(); line++ {
		if line < 2 {
			continue
		}
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			return nil, fmt.Errorf("net/dev line %d: no interface name: %q", line+1, sc.Text())
		}
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if len(f) < 16 {
			return nil, fmt.Errorf("net/dev line %d: %d counters, want 16", line+1, len(f))
		}
		var v [16]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("net/dev line %d, counter %d: %w", line+1, i+1, err)
			}
			v[i] = n
		}
		if name == "lo" {
			continue
		}
		out = append(out, netIface{
			name: name, rxBytes: v[0], rxPackets: v[1], rxErrors: v[2], rxDropped: v[3],
			txBytes: v[8], txPackets: v[9], txErrors: v[10], txDropped: v[11],
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read net/dev: %w", err)
	}
	return out, nil
}

// networkUsage is the CRI NetworkUsage of ifaces: every interface, eth0 as the default.
func networkUsage(ifaces []netIface, at time.Time) *runtime.NetworkUsage {
	u := &runtime.NetworkUsage{Timestamp: at.UnixNano()}
	for _, i := range ifaces {
		iu := &runtime.NetworkInterfaceUsage{
			Name:     i.name,
			RxBytes:  &runtime.UInt64Value{Value: i.rxBytes},
			RxErrors: &runtime.UInt64Value{Value: i.rxErrors},
			TxBytes:  &runtime.UInt64Value{Value: i.txBytes},
			TxErrors: &runtime.UInt64Value{Value: i.txErrors},
		}
		u.Interfaces = append(u.Interfaces, iu)
		if i.name == defaultInterface {
			u.DefaultInterface = iu
		}
	}
	return u
}
