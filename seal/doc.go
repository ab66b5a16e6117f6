// Package seal owns encryption at rest: the keyring (INGEST_ENCRYPTION_KEYS,
// parsed and validated here alone), the sealed form of a JSON value stored
// in a jsonb column (the envelope), and the keyed digest that stands in for
// a plain SHA-256 of a payload when encryption is on.
//
// A Keyring holds AES-256 keys, each under an id; the first encrypts, all
// decrypt. Seal encrypts a value with AES-256-GCM under a fresh random
// 96-bit nonce; the associated data binds the ciphertext to the field
// ("payload" or "result"), the task's id and the key id, so a ciphertext
// copied to another task, another field, or relabelled with another key id
// does not open. The sealed value is a JSON object, the envelope:
//
//	{"$enc":"v1","kid":"k1","ct":"<base64 of nonce || ciphertext || tag>"}
//
// It is valid jsonb, so it is stored in the same column as a plaintext
// value, and the key id sits beside the ciphertext. A value is an envelope
// only if it is an object with exactly these three members and "$enc" is
// "v1" (Parse); package task refuses a new payload with a top-level "$enc"
// member, so a plaintext value is never taken for one.
//
// Guarantees: no method returns, logs or formats a key; errors name key
// ids and entry positions only. A nil *Keyring is encryption off: Seal
// returns the value unchanged, Open returns plaintext values unchanged and
// an *OpenError for an envelope.
package seal
