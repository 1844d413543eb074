package streaming

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// tokenCache holds the requests behind handed-out URLs until they are used or expire.
// A token is single use: the first connection consumes it, so a URL that leaked into a
// log cannot be replayed.
type tokenCache struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[string]tokenEntry
}

type tokenEntry struct {
	req     any
	expires time.Time
}

func newTokenCache(ttl time.Duration, max int) *tokenCache {
	return &tokenCache{ttl: ttl, max: max, now: time.Now, entries: map[string]tokenEntry{}}
}

// insert stores req under a new random token.
func (c *tokenCache) insert(req any) (string, error) {
	var b [18]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("streaming token: %w", err)
	}
	token := base64.RawURLEncoding.EncodeToString(b[:])
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Expired tokens are swept only when the cache fills: a sweep per insert
		// would cost a pass over every pending URL on each Exec.
		for t, e := range c.entries {
			if now.After(e.expires) {
				delete(c.entries, t)
			}
		}
		if len(c.entries) >= c.max {
			return "", fmt.Errorf("%d streaming URLs are waiting to be used; retry in %v: %w", len(c.entries), c.ttl, errdefs.ErrResourceExhausted)
		}
	}
	c.entries[token] = tokenEntry{req: req, expires: now.Add(c.ttl)}
	return token, nil
}

// consume returns the request behind token and forgets it; false for an unknown,
// used or expired token.
func (c *tokenCache) consume(token string) (any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[token]
	if !ok {
		return nil, false
	}
	delete(c.entries, token)
	if c.now().After(e.expires) {
		return nil, false
	}
	return e.req, true
}
