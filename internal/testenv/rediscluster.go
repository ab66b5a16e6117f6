package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// RedisCluster is a throwaway Redis Cluster of redis-server child processes
// (cluster-enabled, no persistence, no replicas), each master serving an
// equal share of the slots. A master that is killed and started again
// keeps its node id and slots (nodes.conf in its directory) and comes back
// empty.
type RedisCluster struct {
	Nodes []*RedisServer
}

// clusterArgs are the redis-server arguments of a cluster node. The node
// timeout is long enough that a loaded test machine does not mark a live
// node failed, and a node restarted at once is never marked failed at all.
var clusterArgs = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "5000", "--cluster-require-full-coverage", "yes"}

// StartRedisCluster starts masters redis-server processes and joins them
// into one cluster (slots assigned with CLUSTER ADDSLOTSRANGE, nodes
// introduced with CLUSTER MEET: the work of redis-cli --cluster create
// without its fixed waits). It returns once every node reports
// cluster_state:ok and knows every slot's owner; the caller closes it.
func StartRedisCluster(masters int) (*RedisCluster, error) {
	if masters < 1 {
		return nil, fmt.Errorf("a cluster needs at least one master, not %d", masters)
	}
	c := &RedisCluster{Nodes: make([]*RedisServer, masters)}
	errs := make([]error, masters)
	var wg sync.WaitGroup
	for i := range masters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Nodes[i], errs[i] = StartRedis(clusterArgs...)
		}()
	}
	wg.Wait()
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

// create assigns the slots and introduces the nodes to each other.
func (c *RedisCluster) create(ctx context.Context) error {
	per := slotCount / len(c.Nodes)
	for i, s := range c.Nodes {
		first, last := i*per, (i+1)*per-1
		if i == len(c.Nodes)-1 {
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
	for i, a := range c.Nodes {
		err := withNode(a, func(n *redis.Client) error {
			for _, b := range c.Nodes[i+1:] {
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
	return c.WaitOK(ctx)
}

// withNode runs f with a plain client of one node.
func withNode(s *RedisServer, f func(*redis.Client) error) error {
	n := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer n.Close()
	return f(n)
}

// WaitOK waits until every node reports cluster_state:ok, knows all the
// other nodes and sees every slot served.
func (c *RedisCluster) WaitOK(ctx context.Context) error {
	var last string
	for {
		last = ""
		for _, s := range c.Nodes {
			err := withNode(s, func(n *redis.Client) error {
				info, err := n.ClusterInfo(ctx).Result()
				if err != nil {
					return err
				}
				want := []string{"cluster_state:ok", fmt.Sprintf("cluster_slots_ok:%d", slotCount), fmt.Sprintf("cluster_known_nodes:%d", len(c.Nodes))}
				for _, w := range want {
					if !strings.Contains(info, w+"\r\n") {
						return fmt.Errorf("no %s in CLUSTER INFO:\n%s", w, info)
					}
				}
				return nil
			})
			if err != nil {
				last = s.Addr() + ": " + err.Error()
				break
			}
		}
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis cluster not ok: %s", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns the cluster URL of the nodes: the first in the host part,
// the others as addr parameters.
func (c *RedisCluster) URL() string {
	var q []string
	for _, s := range c.Nodes[1:] {
		q = append(q, "addr="+s.Addr())
	}
	return "redis://" + c.Nodes[0].Addr() + "?" + strings.Join(q, "&")
}

// Client returns a cluster client of the nodes, closed on cleanup.
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	opt, err := redis.ParseClusterURL(c.URL())
	if err != nil {
		tb.Fatalf("parse redis cluster URL: %v", err)
	}
	cc := redis.NewClusterClient(opt)
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// MasterOf returns the node that serves key's slot.
func (c *RedisCluster) MasterOf(ctx context.Context, key string) (*RedisServer, error) {
	var slot int64
	err := withNode(c.Nodes[0], func(n *redis.Client) (err error) {
		slot, err = n.ClusterKeySlot(ctx, key).Result()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cluster keyslot %q: %w", key, err)
	}
	per := int64(slotCount / len(c.Nodes))
	return c.Nodes[min(slot/per, int64(len(c.Nodes)-1))], nil
}

// Restart starts a killed node again (empty, with its node id and slots)
// and waits until the cluster is ok.
func (c *RedisCluster) Restart(ctx context.Context, s *RedisServer) error {
	if err := s.Start(); err != nil {
		return err
	}
	return c.WaitOK(ctx)
}

// Close kills every node and removes its directory.
func (c *RedisCluster) Close() {
	for _, s := range c.Nodes {
		if s != nil {
			s.Close()
		}
	}
}

// NewRedisCluster starts a three-master Redis Cluster owned by this test,
// closed when the test ends.
func NewRedisCluster(tb testing.TB) *RedisCluster {
	tb.Helper()
	start := time.Now()
	c, err := StartRedisCluster(3)
	if err != nil {
		tb.Fatalf("test redis cluster: %v", err)
	}
	tb.Cleanup(c.Close)
	tb.Logf("redis cluster %s ok in %s", c.URL(), time.Since(start).Round(time.Millisecond))
	return c
}
