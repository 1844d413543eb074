package shimconformance

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is the outcome of one capability.
type Status string

// The three outcomes a capability can have.
const (
	// Pass means the shim did what the capability names.
	Pass Status = "pass"
	// Fail means the shim answered wrongly, not at all, or left something behind.
	Fail Status = "fail"
	// Unsupported means the shim says it does not implement the capability
	// (Unimplemented, no -info, an RPC the mode has no use for).
	Unsupported Status = "unsupported"
)

// Label is how WriteText prints the status: PASS, FAIL or N/S.
func (s Status) Label() string {
	switch s {
	case Pass:
		return "PASS"
	case Fail:
		return "FAIL"
	case Unsupported:
		return "N/S"
	}
	return strings.ToUpper(string(s))
}

// Result is one capability's outcome.
type Result struct {
	// Capability is the stable dotted name, e.g. "task.exit-code".
	Capability string `json:"capability"`
	// Status is pass, fail or unsupported.
	Status Status `json:"status"`
	// Detail is the reason of a failure or of no support, or what a pass measured.
	Detail string `json:"detail,omitempty"`
	// Duration is how long the check took.
	Duration Duration `json:"duration"`
}

// Duration is a time.Duration that encodes as a string in JSON ("1.5s").
type Duration time.Duration

// MarshalJSON encodes the duration as time.Duration's String.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON accepts what MarshalJSON writes, or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration: %w", err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Report is the outcome of one run of the suite against one shim.
type Report struct {
	// Shim is the shim binary's path.
	Shim string `json:"shim"`
	// Mode is sandbox or task.
	Mode Mode `json:"mode"`
	// Version is what the shim's -info or --version said, if anything.
	Version string `json:"version,omitempty"`
	// Results holds one entry per capability run, in the order they ran.
	Results []Result `json:"results"`
}

// Failed reports whether any capability failed.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Status == Fail {
			return true
		}
	}
	return false
}

// Result returns the result of a capability, or false if it did not run.
func (r *Report) Result(capability string) (Result, bool) {
	for _, res := range r.Results {
		if res.Capability == capability {
			return res, true
		}
	}
	return Result{}, false
}

// Counts returns how many capabilities passed, failed and are unsupported.
func (r *Report) Counts() (pass, fail, unsupported int) {
	for _, res := range r.Results {
		switch res.Status {
		case Pass:
			pass++
		case Fail:
			fail++
		case Unsupported:
			unsupported++
		}
	}
	return pass, fail, unsupported
}

// WriteText writes one line per capability (status, name, duration, detail) and a
// summary line.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "# shim %s, mode %s", r.Shim, r.Mode)
	if r.Version != "" {
		_, _ = fmt.Fprintf(tw, ", version %s", r.Version)
	}
	_, _ = fmt.Fprintln(tw)
	for _, res := range r.Results {
		detail := strings.ReplaceAll(res.Detail, "\n", " ")
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", res.Status.Label(), res.Capability, roundDuration(time.Duration(res.Duration)), detail)
	}
	p, f, u := r.Counts()
	_, _ = fmt.Fprintf(tw, "# %d passed, %d failed, %d not supported\n", p, f, u)
	return tw.Flush()
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d
}
