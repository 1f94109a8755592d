package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/extworker/extworker/internal/daemon"
)

// This file is `extworker operators`: the ledger's register of people
// (extworker_operators, migrations/00009). Each person is registered once, with the name
// they carry in the console and their own database login for this tool; the two-person
// rule tells people apart by it. Only the ledger's owner may change it.

const operatorsUsage = `usage: extworker operators <command> [flags]

commands:
  list     [--json]
           the registered operators: name, database login, when and by whom added
  add      NAME [--login LOGIN]
           register a person: NAME in the console and in the ledger's trail, LOGIN their
           own database login for extworker effects (none: console only). Run as the
           ledger's owner
  remove   NAME
           unregister a person (their past decisions keep their name). Run as the owner`

func runOperators(ctx context.Context, cfg daemon.Config, logger *slog.Logger, args []string, stdout, stderr io.Writer) error {
	o := &operatorsCmd{subcommands{group: "operators", cfg: cfg, logger: logger, stdout: stdout, stderr: stderr}}
	return o.dispatch(ctx, args, operatorsUsage, map[string]func(context.Context, []string) error{
		"list":   o.list,
		"add":    o.add,
		"remove": o.remove,
	})
}

type operatorsCmd struct{ subcommands }

type operatorJSON struct {
	Name    string    `json:"name"`
	Login   *string   `json:"login"`
	AddedAt time.Time `json:"added_at"`
	AddedBy string    `json:"added_by"`
}

func (o *operatorsCmd) conn(ctx context.Context) (*pgx.Conn, error) {
	pcfg, err := daemon.DatabaseConfig(o.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	c, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("ledger database at %s: %w", daemon.RedactURL(o.cfg.DatabaseURL), err)
	}
	return c, nil
}

func (o *operatorsCmd) list(ctx context.Context, args []string) error {
	fs, asJSON := o.newFlags("list", "[--json]")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := o.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	rows, err := c.Query(ctx, `SELECT name, db_login, added_at, added_by FROM extworker_operators ORDER BY lower(name)`)
	if err != nil {
		return fmt.Errorf("operators list: %w", err)
	}
	ops, err := pgx.CollectRows(rows, pgx.RowToStructByPos[operatorJSON])
	if err != nil {
		return fmt.Errorf("operators list: %w", err)
	}
	if *asJSON {
		return printJSON(o.stdout, ops)
	}
	tw := newTabWriter(o.stdout)
	fmt.Fprintln(tw, "NAME\tLOGIN\tADDED\tBY")
	for _, p := range ops {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", tableCell(p.Name), tableCell(strOf(p.Login)), fmtTime(p.AddedAt), tableCell(p.AddedBy))
	}
	if len(ops) == 0 {
		fmt.Fprintln(tw, "(nobody is registered: extworker operators add NAME --login LOGIN)")
	}
	return tw.Flush()
}

func (o *operatorsCmd) add(ctx context.Context, args []string) error {
	fs, _ := o.newFlags("add", "NAME [--login LOGIN]")
	login := fs.String("login", "", "the person's own database login, for extworker effects (none: console only)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || strings.TrimSpace(pos[0]) != pos[0] || pos[0] == "" {
		return fmt.Errorf("operators add: one NAME expected, without surrounding spaces, got %q", pos)
	}
	c, err := o.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	var dbLogin *string
	if *login != "" {
		dbLogin = login
	}
	if _, err := c.Exec(ctx, `INSERT INTO extworker_operators (name, db_login) VALUES ($1, $2)`, pos[0], dbLogin); err != nil {
		if msg := alreadyRegistered(ctx, c, pos[0], *login, err); msg != "" {
			return fmt.Errorf("operators add %s: %s (extworker operators list shows who is)", pos[0], msg)
		}
		return fmt.Errorf("operators add %s: %w (the ledger's owner registers operators; a name or a login is registered once)", pos[0], err)
	}
	fmt.Fprintf(o.stdout, "ledger: operator %s registered", pos[0])
	if dbLogin != nil {
		fmt.Fprintf(o.stdout, " with database login %s", *dbLogin)
	}
	fmt.Fprintln(o.stdout)
	return nil
}

// alreadyRegistered says plainly which of the register's unique rules err, from adding
// name with login, broke: the name itself, a name that reads as it, or the login; "" for
// any other error. Adding a name twice is refused, not taken as done: the second add may
// mean another person, or another login.
func alreadyRegistered(ctx context.Context, c *pgx.Conn, name, login string, err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		return ""
	}
	switch pe.ConstraintName {
	case "extworker_operators_pkey":
		return fmt.Sprintf("operator %s is already registered", name)
	case "extworker_operators_name_ci":
		var other string
		if c.QueryRow(ctx, `SELECT name FROM extworker_operators WHERE extworker_name_skeleton(name) = extworker_name_skeleton($1)`, name).Scan(&other) != nil {
			other = "a registered name"
		}
		return fmt.Sprintf("the name reads as %s, already registered (names that read alike are one name: I, l and 1; O and 0; rn and m; case; trailing punctuation)", other)
	case "extworker_operators_db_login_key":
		var other string
		if c.QueryRow(ctx, `SELECT name FROM extworker_operators WHERE db_login = $1`, login).Scan(&other) != nil {
			other = "another operator"
		}
		return fmt.Sprintf("database login %s is already registered, to %s (a login is one person's)", login, other)
	}
	return ""
}

func (o *operatorsCmd) remove(ctx context.Context, args []string) error {
	fs, _ := o.newFlags("remove", "NAME")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("operators remove: one NAME expected, got %q", pos)
	}
	c, err := o.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	tag, err := c.Exec(ctx, `DELETE FROM extworker_operators WHERE lower(name) = lower($1)`, pos[0])
	if err != nil {
		return fmt.Errorf("operators remove %s: %w (the ledger's owner removes operators)", pos[0], err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("operators remove: no operator %q (extworker operators list)", pos[0])
	}
	fmt.Fprintf(o.stdout, "ledger: operator %s removed\n", pos[0])
	return nil
}
