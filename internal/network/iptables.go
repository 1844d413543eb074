package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// The rules of the runtime masquerade (see MasqueradeRuntime), in the nat table of
// iptables and, for IPv6 subnets, ip6tables:
//
//	-A POSTROUTING -m comment --comment "crisp: masquerade pod subnets" -j CRISP-POSTROUTING
//	-A CRISP-POSTROUTING -s S ! -d S -m addrtype ! --dst-type MULTICAST -m comment --comment "crisp-masquerade:OWNER:S" -j MASQUERADE
//
// one rule per pod subnet S; OWNER tells crisp instances apart (masqOwner). That is what the bridge plugin's per-pod chain does for
// each pod of S (ACCEPT to the subnet, MASQUERADE the rest except multicast), in one
// rule and without any work per pod. The binaries are iptables and ip6tables from
// PATH, as the plugins' go-iptables finds them, so the rules land in whichever
// backend (nft or legacy) the plugins, kube-proxy and the operator use.
const (
	// DefaultMasqueradeChain is the nat chain of the rules when Config.MasqueradeChain is empty.
	DefaultMasqueradeChain = "CRISP-POSTROUTING"
	masqJumpComment        = "crisp: masquerade pod subnets"
	masqRulePrefix         = "crisp-masquerade:"
)

// masqTimeout bounds one iptables call; -w makes it wait for the xtables lock, which
// another program may hold for a while (kube-proxy's restores on a big node).
const masqTimeout = 30 * time.Second

// masqRecheck is how long installed rules are trusted before a pod's Setup checks them
// again: a firewall reload may have flushed the nat table, and rules of subnets whose
// last pod is gone are removed then.
const masqRecheck = time.Minute

// iptablesFamily runs one of iptables and ip6tables, for the rules in chain.
type iptablesFamily struct {
	bin   string
	v6    bool
	chain string
}

// masqFamilies are the two families, in the order of masqState.present.
func masqFamilies(chain string) [2]iptablesFamily {
	return [2]iptablesFamily{{bin: "iptables", chain: chain}, {bin: "ip6tables", v6: true, chain: chain}}
}

// run runs the binary with args in the nat table and returns its stdout.
func (f iptablesFamily) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, masqTimeout)
	defer cancel()
	args = append([]string{"-w", "-t", "nat"}, args...)
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, f.bin, args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return "", fmt.Errorf("%s %s: %w", f.bin, strings.Join(args, " "), err)
		}
		return "", fmt.Errorf("%s %s: %w: %s", f.bin, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

// masqRule is the rule spec (without chain) that masquerades traffic leaving subnet,
// tagged with the crisp instance that owns it.
func masqRule(subnet *net.IPNet, owner string) []string {
	s := subnet.String()
	return []string{"-s", s, "!", "-d", s, "-m", "addrtype", "!", "--dst-type", "MULTICAST",
		"-m", "comment", "--comment", masqRulePrefix + owner + ":" + s, "-j", "MASQUERADE"}
}

func (f iptablesFamily) jump() []string {
	return []string{"-m", "comment", "--comment", masqJumpComment, "-j", f.chain}
}

// ruleComment finds the owner and subnet in the comment of one of crisp's rules as
// iptables -S prints it (quoted by both backends; neither part has spaces).
var ruleComment = regexp.MustCompile(`--comment "?` + regexp.QuoteMeta(masqRulePrefix) + `([0-9a-f]+):([^" ]+)"?`)

// masqOwner tags the rules of the crisp instance whose libcni cache is cacheDir. Each
// instance changes only its own rules, so two of them on one host (tests, benchmarks)
// do not remove each other's.
func masqOwner(cacheDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(cacheDir)))
	return hex.EncodeToString(sum[:4])
}

// reconcile makes the family's nat table hold exactly owner's rules for want (subnets
// of this family), leaving other rules in the chain alone. With want empty it removes
// the chain and its jump too once no rule is left in it.
func (f iptablesFamily) reconcile(ctx context.Context, owner string, want []*net.IPNet) error {
	out, listErr := f.run(ctx, "-S", f.chain)
	if listErr != nil {
		// Most likely no such chain, which both backends report with exit status 1 and
		// various messages; creating it tells that apart from a real failure.
		if len(want) == 0 {
			return nil
		}
		if _, err := f.run(ctx, "-N", f.chain); err != nil {
			return fmt.Errorf("list chain %s: %w; create it: %w", f.chain, listErr, err)
		}
		out = ""
	}
	if len(want) > 0 {
		if _, err := f.run(ctx, append([]string{"-C", "POSTROUTING"}, f.jump()...)...); err != nil {
			if _, err := f.run(ctx, append([]string{"-A", "POSTROUTING"}, f.jump()...)...); err != nil {
				return fmt.Errorf("jump to %s from POSTROUTING: %w", f.chain, err)
			}
		}
	}
	own, total := f.parse(out, owner)
	count := map[string]int{}
	for _, r := range own {
		count[r.subnet]++
	}
	keep := map[string]bool{}
	for _, n := range want {
		s := n.String()
		// A subnet's rule is kept only when it is the one rule with its comment and
		// exactly the rule crisp makes (-C), so a changed or duplicated one is replaced.
		if count[s] == 1 {
			if _, err := f.run(ctx, append([]string{"-C", f.chain}, masqRule(n, owner)...)...); err == nil {
				keep[s] = true
			}
		}
	}
	// By spec, which another crisp changing the chain at the same time cannot make hit
	// the wrong rule; then, listed again, by number what someone edited.
	edited := false
	for _, r := range own {
		if keep[r.subnet] {
			continue
		}
		_, n, err := net.ParseCIDR(r.subnet)
		if err == nil {
			_, err = f.run(ctx, append([]string{"-D", f.chain}, masqRule(n, owner)...)...)
		}
		if err != nil {
			edited = true
		}
	}
	if edited {
		out, err := f.run(ctx, "-S", f.chain)
		if err != nil {
			return fmt.Errorf("list chain %s: %w", f.chain, err)
		}
		own, total = f.parse(out, owner)
		// From the bottom up, so that the numbers of the rules still to delete hold.
		for _, r := range slices.Backward(own) {
			if keep[r.subnet] {
				continue
			}
			if _, err := f.run(ctx, "-D", f.chain, strconv.Itoa(r.num)); err != nil {
				return fmt.Errorf("delete stale rule %d (subnet %q) of %s: %w", r.num, r.subnet, f.chain, err)
			}
		}
	}
	for _, r := range own {
		if !keep[r.subnet] {
			total--
		}
	}
	if len(want) == 0 {
		if total > 0 {
			return nil // another crisp's rules, or an operator's
		}
		return f.remove(ctx)
	}
	for _, n := range want {
		if keep[n.String()] {
			continue
		}
		if _, err := f.run(ctx, append([]string{"-A", f.chain}, masqRule(n, owner)...)...); err != nil {
			return fmt.Errorf("masquerade pod subnet %s: %w", n, err)
		}
	}
	return nil
}

// reconcileTraced is reconcile in a span of its own: each family's rules take a few
// iptables runs.
func (f iptablesFamily) reconcileTraced(ctx context.Context, owner string, want []*net.IPNet) error {
	ctx, span := tracing.Start(ctx, spanMasqFamily)
	if span.IsRecording() {
		span.SetAttributes(attrBinary.String(f.bin), attrSubnets.String(joinCIDRs(want)))
	}
	err := f.reconcile(ctx, owner, want)
	tracing.End(span, err)
	return err
}

// masqRuleLine is one of an owner's rules as listed: its number, as -D takes it, and
// its subnet.
type masqRuleLine struct {
	num    int
	subnet string
}

// parse picks owner's rules out of iptables -S output for the chain, and counts all
// rules in it.
func (f iptablesFamily) parse(out, owner string) (own []masqRuleLine, total int) {
	for line := range strings.SplitSeq(out, "\n") {
		if !strings.HasPrefix(line, "-A "+f.chain+" ") {
			continue
		}
		total++
		if m := ruleComment.FindStringSubmatch(line); m != nil && m[1] == owner {
			own = append(own, masqRuleLine{num: total, subnet: m[2]})
		}
	}
	return own, total
}

// remove deletes the jump (every copy) and the chain.
func (f iptablesFamily) remove(ctx context.Context) error {
	for range 100 { // bounded: a -D that keeps "succeeding" must not loop for ever
		if _, err := f.run(ctx, append([]string{"-D", "POSTROUTING"}, f.jump()...)...); err != nil {
			break
		}
	}
	if _, err := f.run(ctx, "-F", f.chain); err != nil {
		return fmt.Errorf("flush %s: %w", f.chain, err)
	}
	if _, err := f.run(ctx, "-X", f.chain); err != nil {
		return fmt.Errorf("delete %s: %w", f.chain, err)
	}
	return nil
}

// ofFamily returns the subnets of nets that are IPv6 (v6) or IPv4.
func ofFamily(nets []*net.IPNet, v6 bool) []*net.IPNet {
	var out []*net.IPNet
	for _, n := range nets {
		if (n.IP.To4() == nil) == v6 {
			out = append(out, n)
		}
	}
	return out
}

// MasqueradeError is a runtime masquerade rule crisp could not install. Pods of its
// subnets are not set up without it: they would have no NAT to the outside.
type MasqueradeError struct {
	Subnets []*net.IPNet
	Err     error
}

func (e *MasqueradeError) Error() string {
	return fmt.Sprintf("masquerade for pod subnet %s is not in place (cni.masquerade = \"runtime\"; \"plugin\" leaves it to the bridge plugin): %v",
		joinCIDRs(e.Subnets), e.Err)
}

func (e *MasqueradeError) Unwrap() error { return e.Err }

// masqState is what the manager knows of the runtime masquerade rules it installed.
type masqState struct {
	// owner tags this instance's rules (masqOwner).
	owner string

	mu sync.Mutex
	// synced: the rules matched key (and the pods' cached needs) at at.
	synced bool
	key    string
	at     time.Time
	// present: crisp's chain is in the family's nat table (index as masqFamilies).
	present [2]bool
	// inflight counts the ADDs under way per subnet: their pods rely on the rule but
	// are not in libcni's cache yet, so a resync for another config must keep it.
	inflight map[string]int
}

// ensureMasq makes sure the rules for want are installed before a pod of these subnets
// is set up, and keeps them until release is called (when the pod's ADD is over and
// cached). Installed rules are trusted for masqRecheck.
func (m *Manager) ensureMasq(ctx context.Context, want []*net.IPNet) (release func(), err error) {
	ms := &m.masq
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, n := range want {
		ms.inflight[n.String()]++
	}
	done := func() {
		for _, n := range want {
			if ms.inflight[n.String()]--; ms.inflight[n.String()] <= 0 {
				delete(ms.inflight, n.String())
			}
		}
	}
	if err := m.syncMasqLocked(ctx, want, false); err != nil {
		done()
		return nil, err
	}
	return func() {
		ms.mu.Lock()
		defer ms.mu.Unlock()
		done()
	}, nil
}

// syncMasq installs the rules for want (the current config's subnets) and removes
// those no pod needs any more. Errors are the families whose rules for want failed;
// failures to remove stale rules are only logged (and retried at the next sync).
func (m *Manager) syncMasq(ctx context.Context, want []*net.IPNet) error {
	m.masq.mu.Lock()
	defer m.masq.mu.Unlock()
	return m.syncMasqLocked(ctx, want, true)
}

func (m *Manager) syncMasqLocked(ctx context.Context, want []*net.IPNet, force bool) (err error) {
	ms := &m.masq
	key := joinCIDRs(want)
	if !force && ms.synced && ms.key == key && time.Since(ms.at) < masqRecheck {
		return nil
	}
	// A span only past the check above: most pods trust the installed rules.
	ctx, span := tracing.Start(ctx, spanMasq)
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		span.SetAttributes(attrSubnets.String(key))
	}
	all := slices.Clone(want)
	for s := range ms.inflight {
		if _, n, err := net.ParseCIDR(s); err == nil {
			all = append(all, n)
		}
	}
	if len(all) == 0 && ms.synced && ms.present == [2]bool{} {
		// Nothing wanted and nothing installed; pods needing rules installed them.
		ms.key, ms.at = key, time.Now()
		return nil
	}
	// Pods set up with runtime masquerade keep their rule until they are torn down,
	// whatever the config says now (libcni caches the list they were set up with).
	atts, cerr := m.cni.GetCachedAttachments("")
	if cerr != nil {
		m.log.Warn("read CNI result cache for the masquerade rules pods rely on", "err", cerr)
	}
	for _, a := range atts {
		all = append(all, cachedMasqSubnets(a.Config)...)
	}
	all = uniqueNets(all)
	var errs []error
	for i, f := range masqFamilies(m.cfg.MasqueradeChain) {
		fam := ofFamily(all, f.v6)
		if len(fam) == 0 && ms.synced && !ms.present[i] {
			continue
		}
		if err := f.reconcileTraced(ctx, ms.owner, fam); err != nil {
			if needed := ofFamily(want, f.v6); len(needed) > 0 {
				errs = append(errs, &MasqueradeError{Subnets: needed, Err: err})
			} else {
				m.log.Warn("update pod subnet masquerade rules", "binary", f.bin, "subnets", joinCIDRs(fam), "err", err)
			}
			ms.present[i] = true // something may be there: look again next time
			continue
		}
		ms.present[i] = len(fam) > 0
	}
	if err := errors.Join(errs...); err != nil {
		ms.synced = false
		return err
	}
	if len(all) > 0 && (!ms.synced || ms.key != key) {
		m.log.Info("pod subnet masquerade rules in place", "chain", m.cfg.MasqueradeChain, "subnets", joinCIDRs(all))
	}
	ms.synced, ms.key, ms.at = true, key, time.Now()
	return nil
}

// uniqueNets drops repeated subnets, keeping the first.
func uniqueNets(nets []*net.IPNet) []*net.IPNet {
	var out []*net.IPNet
	seen := map[string]bool{}
	for _, n := range nets {
		if !seen[n.String()] {
			seen[n.String()] = true
			out = append(out, n)
		}
	}
	return out
}
