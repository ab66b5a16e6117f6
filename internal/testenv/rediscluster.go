package testenv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// RedisCluster is a throwaway Redis Cluster of redis-server child processes
// (cluster-enabled, no persistence), each master serving an equal share of
// the slots, optionally with one replica each. A node that is killed and
// started again keeps its node id and role (nodes.conf in its directory)
// and comes back empty.
type RedisCluster struct {
	// Masters are the nodes created as masters, Replicas[i] (if any) the
	// replica of Masters[i]; after a failover the roles differ.
	Masters, Replicas []*RedisServer

	mu   sync.Mutex
	down map[*RedisServer]bool // killed by Kill, not started again
}

// ClusterOptions shape a test cluster.
type ClusterOptions struct {
	Masters int // default 3
	// Replicas: one replica per master.
	Replicas bool
	// NodeTimeout is cluster-node-timeout: how long a node must be
	// unreachable before it is failed (and a replica takes over). Default
	// 5 s: a loaded test machine does not fail a live node, and a master
	// restarted at once is never failed.
	NodeTimeout time.Duration
}

// StartRedisCluster starts a cluster (slots assigned with CLUSTER
// ADDSLOTSRANGE, nodes introduced with CLUSTER MEET, replicas attached with
// CLUSTER REPLICATE: the work of redis-cli --cluster create without its
// fixed waits). It returns once every node reports cluster_state:ok and
// knows every slot's owner, and every replica is in sync; the caller
// closes it.
func StartRedisCluster(o ClusterOptions) (*RedisCluster, error) {
	if o.Masters == 0 {
		o.Masters = 3
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = 5 * time.Second
	}
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10), "--cluster-require-full-coverage", "yes"}
	n := o.Masters
	if o.Replicas {
		n *= 2
	}
	nodes := make([]*RedisServer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = StartRedis(args...)
		}()
	}
	wg.Wait()
	c := &RedisCluster{Masters: nodes[:o.Masters], Replicas: nodes[o.Masters:], down: map[*RedisServer]bool{}}
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.create(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Nodes returns every node, masters first.
func (c *RedisCluster) Nodes() []*RedisServer {
	return append(append([]*RedisServer{}, c.Masters...), c.Replicas...)
}

// create assigns the slots, introduces the nodes to each other and
// attaches the replicas.
func (c *RedisCluster) create(ctx context.Context) error {
	per := slotCount / len(c.Masters)
	for i, s := range c.Masters {
		first, last := i*per, (i+1)*per-1
		if i == len(c.Masters)-1 {
			last = slotCount - 1
		}
		err := withNode(s, func(n *redis.Client) error {
			// Distinct config epochs, as redis-cli sets them: no epoch
			// collision to resolve before the cluster settles.
			if err := n.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
				return fmt.Errorf("cluster set-config-epoch: %w", err)
			}
			if err := n.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", first, last).Err(); err != nil {
				return fmt.Errorf("cluster addslotsrange %d %d: %w", first, last, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("redis-server %s: %w", s.Addr(), err)
		}
	}
	// Every node meets every other: no waiting for gossip to spread them.
	all := c.Nodes()
	for i, a := range all {
		err := withNode(a, func(n *redis.Client) error {
			for _, b := range all[i+1:] {
				if err := n.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", b.Port).Err(); err != nil {
					return fmt.Errorf("cluster meet %s: %w", b.Addr(), err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("redis-server %s: %w", a.Addr(), err)
		}
	}
	for i, r := range c.Replicas {
		if err := c.replicate(ctx, r, c.Masters[i]); err != nil {
			return err
		}
	}
	return c.WaitOK(ctx)
}

// replicate makes r a replica of m, once r knows m from the handshake.
func (c *RedisCluster) replicate(ctx context.Context, r, m *RedisServer) error {
	var id string
	if err := withNode(m, func(n *redis.Client) (err error) {
		id, err = n.ClusterMyID(ctx).Result()
		return err
	}); err != nil {
		return fmt.Errorf("redis-server %s: cluster myid: %w", m.Addr(), err)
	}
	return withNode(r, func(n *redis.Client) error {
		for {
			err := n.ClusterReplicate(ctx, id).Err()
			if err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("redis-server %s: cluster replicate %s (%s): %w", r.Addr(), id, m.Addr(), err)
			case <-time.After(20 * time.Millisecond): // not known yet
			}
		}
	})
}

// withNode runs f with a plain client of one node.
func withNode(s *RedisServer, f func(*redis.Client) error) error {
	n := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer n.Close()
	return f(n)
}

// live returns the nodes not killed by Kill.
func (c *RedisCluster) live() []*RedisServer {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*RedisServer
	for _, s := range c.Nodes() {
		if !c.down[s] {
			out = append(out, s)
		}
	}
	return out
}

// WaitOK waits until every live node reports cluster_state:ok, knows all
// the nodes and sees every slot served, and every live replica's link to
// its master is up.
func (c *RedisCluster) WaitOK(ctx context.Context) error {
	total := len(c.Nodes())
	check := func(n *redis.Client) error {
		info, err := n.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		for _, w := range []string{"cluster_state:ok", fmt.Sprintf("cluster_slots_ok:%d", slotCount), fmt.Sprintf("cluster_known_nodes:%d", total)} {
			if !strings.Contains(info, w+"\r\n") {
				return fmt.Errorf("no %s in CLUSTER INFO:\n%s", w, info)
			}
		}
		repl, err := n.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("replica not in sync:\n%s", repl)
		}
		return nil
	}
	for {
		var last error
		for _, s := range c.live() {
			if err := withNode(s, check); err != nil {
				last = fmt.Errorf("%s: %w", s.Addr(), err)
				break
			}
		}
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis cluster not ok: %w", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns the cluster URL of the masters: the first in the host part,
// the others as addr parameters.
func (c *RedisCluster) URL() string {
	var q []string
	for _, s := range c.Masters[1:] {
		q = append(q, "addr="+s.Addr())
	}
	return "redis://" + c.Masters[0].Addr() + "?" + strings.Join(q, "&")
}

// Client returns a cluster client of the nodes, closed on cleanup. Like
// the binary's, it reloads the slot map every second: a failed master
// refuses connections and sends no MOVED, so only a reload finds the
// replica that took over (go-redis's default is a minute).
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	opt, err := redis.ParseClusterURL(c.URL())
	if err != nil {
		tb.Fatalf("parse redis cluster URL: %v", err)
	}
	opt.ClusterStateReloadInterval = time.Second
	cc := redis.NewClusterClient(opt)
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// MasterOf returns the node that serves key's slot now, as a live node
// sees it (CLUSTER SHARDS: the shard's online master).
func (c *RedisCluster) MasterOf(ctx context.Context, key string) (*RedisServer, error) {
	live := c.live()
	if len(live) == 0 {
		return nil, errors.New("no live node")
	}
	var slot int64
	var shards []redis.ClusterShard
	err := withNode(live[0], func(n *redis.Client) (err error) {
		if slot, err = n.ClusterKeySlot(ctx, key).Result(); err != nil {
			return fmt.Errorf("cluster keyslot %q: %w", key, err)
		}
		if shards, err = n.ClusterShards(ctx).Result(); err != nil {
			return fmt.Errorf("cluster shards: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if slot < r.Start || slot > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role != "master" || n.Health != "online" {
					continue
				}
				for _, s := range c.Nodes() {
					if int64(s.Port) == n.Port {
						return s, nil
					}
				}
				return nil, fmt.Errorf("slot %d is served by port %d, not a node of this cluster", slot, n.Port)
			}
		}
	}
	return nil, fmt.Errorf("slot %d of %q has no online master", slot, key)
}

// Kill kills a node at once (SIGKILL): what it held is gone. WaitOK and
// MasterOf leave it out until Restart.
func (c *RedisCluster) Kill(s *RedisServer) {
	c.mu.Lock()
	c.down[s] = true
	c.mu.Unlock()
	s.Kill()
}

// Restart starts a killed node again (empty, with its node id and slots)
// and waits until the cluster is ok.
func (c *RedisCluster) Restart(ctx context.Context, s *RedisServer) error {
	if err := s.Start(); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.down, s)
	c.mu.Unlock()
	return c.WaitOK(ctx)
}

// WaitFailover waits until a live node other than old serves key's slot
// (a replica of old was promoted) and the cluster is ok, and returns it.
func (c *RedisCluster) WaitFailover(ctx context.Context, key string, old *RedisServer) (*RedisServer, error) {
	for {
		m, err := c.MasterOf(ctx, key)
		if err == nil && m != old {
			return m, c.WaitOK(ctx)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no failover of %s: %w", old.Addr(), errors.Join(err, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close kills every node and removes its directory.
func (c *RedisCluster) Close() {
	for _, s := range c.Nodes() {
		if s != nil {
			s.Close()
		}
	}
}

// NewRedisCluster starts a Redis Cluster owned by this test (three
// masters by default), closed when the test ends.
func NewRedisCluster(tb testing.TB, o ClusterOptions) *RedisCluster {
	tb.Helper()
	start := time.Now()
	c, err := StartRedisCluster(o)
	if err != nil {
		tb.Fatalf("test redis cluster: %v", err)
	}
	tb.Cleanup(c.Close)
	tb.Logf("redis cluster %s (%d nodes) ok in %s", c.URL(), len(c.Nodes()), time.Since(start).Round(time.Millisecond))
	return c
}
