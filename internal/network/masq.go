package network

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// Masquerade says who masquerades pod traffic leaving the pod subnet of a bridge
// network with ipMasq: the bridge plugin, or crisp.
type Masquerade string

const (
	// MasqueradeRuntime means crisp passes the bridge plugin ipMasq false and keeps one
	// MASQUERADE rule per pod subnet itself (masq_linux.go). The plugin would create and
	// delete an iptables chain per pod, about 60 ms of every pod's ADD and DEL.
	MasqueradeRuntime Masquerade = "runtime"
	// MasqueradePlugin leaves ipMasq to the plugin, as other runtimes do.
	MasqueradePlugin Masquerade = "plugin"
)

// masqKey is a top-level key crisp adds to a network list whose masquerade it does. It
// lists the subnets, and since libcni caches the list with each pod's result it says,
// for every pod, which rules the pod relies on: they are kept while such a pod lives,
// even after the config changed. libcni and the plugins ignore top-level keys they do
// not know (plugins only ever see their own entry of the list).
const masqKey = "crispMasquerade"

// masqPlan is what the runtime masquerade makes of one network config.
type masqPlan struct {
	// list is what ADD uses: list itself, or a copy in which the bridge plugins crisp
	// masquerades for have ipMasq false and which carries masqKey.
	list *libcni.NetworkConfigList
	// subnets crisp must masquerade for pods of list, in config order, without duplicates.
	subnets []*net.IPNet
	// kept says why bridge plugins with ipMasq keep doing it themselves, one entry each.
	kept []string
}

// planMasquerade takes over ipMasq from list's bridge plugins whose pod subnets crisp
// can tell (host-local IPAM with ranges or subnet). The operator's file is never
// changed: only the list in memory, and the copy of it libcni caches per pod, so a
// pod's DEL runs with the ipMasq its ADD had.
func planMasquerade(list *libcni.NetworkConfigList) (masqPlan, error) {
	plan := masqPlan{list: list}
	var raw map[string]any
	dec := json.NewDecoder(bytes.NewReader(list.Bytes))
	dec.UseNumber() // numbers go back out as they came in (no float64 rounding)
	if err := dec.Decode(&raw); err != nil {
		return plan, fmt.Errorf("parse network list %q: %w", list.Name, err)
	}
	inline, _ := raw["plugins"].([]any)
	changed := false
	for i, p := range list.Plugins {
		if p.Network.Type != "bridge" || !ipMasqOn(p.Bytes) {
			continue
		}
		// Plugins loaded from files next to the list are not in list.Bytes, which is
		// what libcni caches for DEL: changing them here would tear pods down with the
		// wrong ipMasq.
		if i >= len(inline) {
			plan.kept = append(plan.kept, fmt.Sprintf("plugin %d (bridge) is not inline in the network list", i))
			continue
		}
		obj, ok := inline[i].(map[string]any)
		if !ok {
			plan.kept = append(plan.kept, fmt.Sprintf("plugin %d (bridge) is not a JSON object", i))
			continue
		}
		subnets, why := hostLocalSubnets(p.Bytes)
		if why != "" {
			plan.kept = append(plan.kept, fmt.Sprintf("plugin %d (bridge): %s", i, why))
			continue
		}
		obj["ipMasq"] = false
		changed = true
		for _, s := range subnets {
			if !slices.ContainsFunc(plan.subnets, func(n *net.IPNet) bool { return n.String() == s.String() }) {
				plan.subnets = append(plan.subnets, s)
			}
		}
	}
	if !changed {
		return plan, nil
	}
	names := make([]string, len(plan.subnets))
	for i, n := range plan.subnets {
		names[i] = n.String()
	}
	raw[masqKey] = names
	data, err := json.Marshal(raw)
	if err != nil {
		return plan, fmt.Errorf("encode network list %q: %w", list.Name, err)
	}
	// Plugin entries are re-read from the new bytes; those loaded from files (after the
	// inline ones) are carried over as they are.
	nl, err := libcni.NetworkConfFromBytes(data)
	if err != nil {
		return plan, fmt.Errorf("reparse network list %q: %w", list.Name, err)
	}
	nl.Plugins = append(nl.Plugins, list.Plugins[len(inline):]...)
	plan.list = nl
	return plan, nil
}

// ipMasqOn reports whether a plugin config has ipMasq true.
func ipMasqOn(conf []byte) bool {
	var c struct {
		IPMasq bool `json:"ipMasq"`
	}
	return json.Unmarshal(conf, &c) == nil && c.IPMasq
}

// hostLocalSubnets returns the subnets host-local gives the plugin's pods addresses
// from, or why they cannot be told.
func hostLocalSubnets(conf []byte) ([]*net.IPNet, string) {
	var c struct {
		IPAM struct {
			Type   string `json:"type"`
			Subnet string `json:"subnet"`
			Ranges [][]struct {
				Subnet string `json:"subnet"`
			} `json:"ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		return nil, fmt.Sprintf("unreadable config: %v", err)
	}
	if c.IPAM.Type != "host-local" {
		return nil, fmt.Sprintf("IPAM %q is not host-local, so its pod subnets are not known in advance", c.IPAM.Type)
	}
	var cidrs []string
	for _, set := range c.IPAM.Ranges {
		for _, r := range set {
			cidrs = append(cidrs, r.Subnet)
		}
	}
	if len(c.IPAM.Ranges) == 0 && c.IPAM.Subnet != "" {
		cidrs = append(cidrs, c.IPAM.Subnet) // the format before ranges
	}
	if len(cidrs) == 0 {
		return nil, "host-local IPAM has neither ranges nor subnet"
	}
	var out []*net.IPNet
	for _, s := range cidrs {
		_, n, err := net.ParseCIDR(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Sprintf("host-local subnet %q: %v", s, err)
		}
		out = append(out, n)
	}
	return out, ""
}

// cachedMasqSubnets returns the subnets a cached network list says crisp masquerades
// for its pod (masqKey), nil for a pod set up with the plugin's ipMasq.
func cachedMasqSubnets(conf []byte) []*net.IPNet {
	var c map[string]json.RawMessage
	if json.Unmarshal(conf, &c) != nil {
		return nil
	}
	var names []string
	if json.Unmarshal(c[masqKey], &names) != nil {
		return nil
	}
	var out []*net.IPNet
	for _, s := range names {
		if _, n, err := net.ParseCIDR(s); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// MasqueradeSubnets returns the pod subnets crisp masquerades for list with
// cni.masquerade = "runtime" (chain DefaultMasqueradeChain), and why bridge plugins
// with ipMasq keep doing it themselves. `criserver check` reports on them.
func MasqueradeSubnets(list *libcni.NetworkConfigList) (subnets []*net.IPNet, kept []string, err error) {
	plan, err := planMasquerade(list)
	return plan.subnets, plan.kept, err
}

// DefaultMasqueradeSubnets is MasqueradeSubnets of the network criserver writes into
// an empty config dir for defaultSubnet (see Config.DefaultSubnet).
func DefaultMasqueradeSubnets(defaultSubnet string) ([]*net.IPNet, error) {
	data, err := defaultConfList(Config{DefaultBridge: DefaultBridge, DefaultSubnet: defaultSubnet})
	if err != nil {
		return nil, err
	}
	list, err := libcni.NetworkConfFromBytes(data)
	if err != nil {
		return nil, err
	}
	subnets, _, err := MasqueradeSubnets(list)
	return subnets, err
}
