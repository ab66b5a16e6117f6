"""Enqueue an ingest task from Python, in the transaction that writes the
order it belongs to: the task exists if and only if the order does."""

import os

import psycopg
from psycopg.types.json import Jsonb


def place_order(conn, order_id, total, commit):
    with conn.transaction():
        conn.execute("INSERT INTO py_order (id, total) VALUES (%s, %s)", (order_id, total))
        task_id = conn.execute(
            "SELECT ingest_enqueue(%s, %s, %s)",
            ("py-invoice", Jsonb({"order_id": order_id}), Jsonb({"idempotency_key": f"order-{order_id}", "max_attempts": 5})),
        ).fetchone()[0]
        print(f"order {order_id}: enqueued task {task_id}")
        if not commit:
            raise psycopg.Rollback()
    print(f"order {order_id}: {'committed' if commit else 'rolled back'} {task_id}")


# autocommit: each conn.transaction() block is one explicit transaction.
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS py_order (id int PRIMARY KEY, total numeric NOT NULL)")
    place_order(conn, 1, 42, commit=True)
    place_order(conn, 2, 17, commit=False)
    try:
        conn.execute("SELECT ingest_enqueue('py-invoice', '{}', '{\"max_attempts\": 0}')")
    except psycopg.errors.InvalidParameterValue as e:
        print(f"refused: SQLSTATE {e.sqlstate}, field {e.diag.column_name}: {e.diag.message_primary}")
