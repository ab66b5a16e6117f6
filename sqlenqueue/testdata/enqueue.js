// Enqueue an ingest task from Node.js, in the transaction that writes the
// order it belongs to: the task exists if and only if the order does.
'use strict';
const { Client } = require('pg');

async function placeOrder(client, orderId, total, commit) {
  await client.query('BEGIN');
  try {
    await client.query('INSERT INTO node_order (id, total) VALUES ($1, $2)', [orderId, total]);
    const { rows } = await client.query('SELECT ingest_enqueue($1, $2, $3) AS id', [
      'node-invoice', { order_id: orderId }, { idempotency_key: `order-${orderId}`, max_attempts: 5 },
    ]);
    console.log(`order ${orderId}: enqueued task ${rows[0].id}`);
    await client.query(commit ? 'COMMIT' : 'ROLLBACK');
    console.log(`order ${orderId}: ${commit ? 'committed' : 'rolled back'} ${rows[0].id}`);
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  }
}

async function main() {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query('CREATE TABLE IF NOT EXISTS node_order (id int PRIMARY KEY, total numeric NOT NULL)');
    await placeOrder(client, 1, 42, true);
    await placeOrder(client, 2, 17, false);
    try {
      await client.query("SELECT ingest_enqueue('node-invoice', '{}', '{\"max_attempts\": 0}')");
    } catch (err) {
      console.log(`refused: SQLSTATE ${err.code}, field ${err.column}: ${err.message}`);
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
