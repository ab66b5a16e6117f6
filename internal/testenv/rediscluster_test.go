package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c := NewRedisCluster(t, ClusterOptions{})
	ctx := context.Background()
	rdb := c.Client(t)
	// Keys on every master; one hash tag keeps keys in one slot.
	for i := range 30 {
		if err := rdb.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range c.Nodes() {
		n := redis.NewClient(&redis.Options{Addr: s.Addr()})
		k, err := n.DBSize(ctx).Result()
		n.Close()
		if err != nil || k == 0 {
			t.Fatalf("node %s holds %d keys (%v): the slots are not spread", s.Addr(), k, err)
		}
	}
	m, err := c.MasterOf(ctx, "{x}:a")
	if err != nil {
		t.Fatal(err)
	}
	n := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer n.Close()
	if err := rdb.Set(ctx, "{x}:a", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := n.Get(ctx, "{x}:a").Result(); err != nil || v != "1" {
		t.Fatalf("MasterOf({x}:a) = %s, which has %q (%v)", m.Addr(), v, err)
	}
	// A restarted master comes back empty with its slots.
	c.Kill(m)
	if err := c.Restart(ctx, m); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "the restarted master to answer through the cluster client", func() bool {
		err := rdb.Get(ctx, "{x}:a").Err()
		return errors.Is(err, redis.Nil)
	})
}

func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	c := NewRedisCluster(t, ClusterOptions{Replicas: true, NodeTimeout: time.Second})
	ctx := context.Background()
	rdb := c.Client(t)
	if err := rdb.Set(ctx, "{x}:a", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := c.MasterOf(ctx, "{x}:a")
	if err != nil {
		t.Fatal(err)
	}
	// WAIT: the write reached the replica before its master dies.
	if err := withNode(m, func(n *redis.Client) error { return n.Wait(ctx, 1, 5*time.Second).Err() }); err != nil {
		t.Fatal(err)
	}
	c.Kill(m)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	promoted, err := c.WaitFailover(wctx, "{x}:a", m)
	if err != nil {
		t.Fatal(err)
	}
	if promoted == m {
		t.Fatalf("the killed master %s still serves the slot", m.Addr())
	}
	Eventually(t, 10*time.Second, "the key read from the promoted replica", func() bool {
		v, err := rdb.Get(ctx, "{x}:a").Result()
		return err == nil && v == "1"
	})
}
