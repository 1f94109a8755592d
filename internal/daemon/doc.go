// Package daemon is what every extworker process shares: its configuration from
// EXTWORKER_* variables (and their _FILE secrets) with every problem listed at once,
// the engine client and the credential check (exit status ExitConfig when the engine
// rejects them), the ledger's pool and migration check, the operations server
// (/metrics, /healthz, /readyz), and the `config` command that prints the effective
// configuration with secrets masked. The public entry point for workers (package
// extworker) and the operator's binary (cmd/extworker) are built on it.
package daemon
