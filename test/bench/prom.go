package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// The histograms crisp breaks a pod start into (metrics/metrics.go).
const (
	PodStartPhases  = "crisp_pod_start_phase_duration_seconds"
	CtrCreatePhases = "crisp_container_create_phase_duration_seconds"
)

// ParseExposition reads the Prometheus text format into its samples by series as
// exposed (name{label="v",...}); comments and blank lines are skipped.
func ParseExposition(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The value follows the series (whose label values may hold spaces) and may be
		// followed by a timestamp.
		rest := line
		if j := strings.LastIndexByte(rest, '}'); j >= 0 {
			rest = rest[j+1:]
		} else if j := strings.IndexByte(rest, ' '); j >= 0 {
			rest = rest[j:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 || len(f) > 2 {
			return nil, fmt.Errorf("bad exposition line %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bad value in %q: %w", line, err)
		}
		out[strings.TrimSpace(line[:len(line)-len(rest)])] = v
	}
	return out, sc.Err()
}

// PhaseMeans is the mean of each phase of histogram (sum over count of the series
// with that phase label), in seconds; phases never observed are left out.
func PhaseMeans(samples map[string]float64, histogram string) map[string]float64 {
	sums, counts := map[string]float64{}, map[string]float64{}
	for series, v := range samples {
		name, labels, _ := strings.Cut(series, "{")
		phase, ok := label(labels, "phase")
		if !ok {
			continue
		}
		switch name {
		case histogram + "_sum":
			sums[phase] = v
		case histogram + "_count":
			counts[phase] = v
		}
	}
	out := map[string]float64{}
	for phase, n := range counts {
		if s, ok := sums[phase]; ok && n > 0 {
			out[phase] = s / n
		}
	}
	return out
}

// label finds a label's value in the inside of a series' braces (`a="x",b="y"}`).
// crisp's label values hold no quotes or commas, so no unescaping is needed.
func label(labels, name string) (string, bool) {
	labels = strings.TrimSuffix(labels, "}")
	for _, kv := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.TrimSpace(k) == name {
			return strings.Trim(strings.TrimSpace(v), `"`), true
		}
	}
	return "", false
}

// Scrape fetches and parses a /metrics URL.
func Scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return ParseExposition(resp.Body)
}
