#!/usr/bin/env bash
# Makes sure the database servers the PostgreSQL and MySQL/MariaDB tests talk to are up, and
# tells the caller which ones are.
#
#   eval "$(bash .ci/services.sh)"
#
# For each server: if it does not answer, start it (PostgreSQL with pg_ctlcluster, MariaDB with
# start-stop-daemon), wait until it accepts connections (up to 60 s in all), create the `test`
# database if it is missing, and print on stdout
#
#   export TSR_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test
#   export TSR_MYSQL_URL=mysql://root@127.0.0.1:3306/test
#
# only for the servers that are up and have that database. Everything else (progress, why a
# server is missing) goes to stderr. It never fails: on a machine without a server its line is
# simply not printed, and the tests that need it say they are skipped.

set -u

PG_URL="postgres://postgres@127.0.0.1:5432/test"
MYSQL_URL="mysql://root@127.0.0.1:3306/test"
WAIT_SECONDS="${TSR_SERVICES_WAIT:-60}"

say() { echo "services: $*" >&2; }

pg_up() { timeout 5 pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
mysql_up() {
    timeout 5 mariadb-admin --connect-timeout=2 -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1
}
psql_q() { timeout 10 psql -X -q -h 127.0.0.1 -p 5432 -U postgres "$@" 2>&1; }
mysql_q() { timeout 10 mariadb --connect-timeout=2 -h 127.0.0.1 -P 3306 -u root "$@" 2>&1; }

# --- start what is down ---------------------------------------------------------------------

pg_wanted=0
if ! command -v pg_isready >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
    say "PostgreSQL: no pg_isready/psql on this machine; PostgreSQL tests will be skipped"
elif pg_up; then
    pg_wanted=1
else
    pg_wanted=1
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
        for version in $(ls /etc/postgresql); do
            say "PostgreSQL: not answering; starting cluster $version/main"
            timeout 60 pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 2>&1 \
                || say "PostgreSQL: pg_ctlcluster $version main start failed"
        done
    else
        say "PostgreSQL: not answering, and no pg_ctlcluster or /etc/postgresql to start it"
    fi
fi

mysql_wanted=0
if ! command -v mariadb-admin >/dev/null 2>&1 || ! command -v mariadb >/dev/null 2>&1; then
    say "MariaDB: no mariadb-admin/mariadb on this machine; MySQL tests will be skipped"
elif mysql_up; then
    mysql_wanted=1
else
    mysql_wanted=1
    if [ -x /usr/sbin/mariadbd ] && command -v start-stop-daemon >/dev/null 2>&1; then
        say "MariaDB: not answering; starting /usr/sbin/mariadbd"
        # /run is a tmpfs: the socket directory may be gone after a reboot.
        if id mysql >/dev/null 2>&1; then
            install -d -o mysql -g mysql -m 0755 /run/mysqld 2>/dev/null || true
        fi
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >&2 2>&1 \
            || say "MariaDB: start-stop-daemon failed"
    else
        say "MariaDB: not answering, and no /usr/sbin/mariadbd or start-stop-daemon to start it"
    fi
fi

# --- wait for them (one deadline for both) --------------------------------------------------

deadline=$((SECONDS + WAIT_SECONDS))
pg_ready=0
mysql_ready=0
while :; do
    [ "$pg_wanted" = 1 ] && [ "$pg_ready" = 0 ] && pg_up && pg_ready=1
    [ "$mysql_wanted" = 1 ] && [ "$mysql_ready" = 0 ] && mysql_up && mysql_ready=1
    if { [ "$pg_wanted" = 0 ] || [ "$pg_ready" = 1 ]; } &&
        { [ "$mysql_wanted" = 0 ] || [ "$mysql_ready" = 1 ]; }; then
        break
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        break
    fi
    sleep 1
done

# --- the `test` databases, and the variables ------------------------------------------------

if [ "$pg_wanted" = 1 ]; then
    if [ "$pg_ready" = 0 ]; then
        say "PostgreSQL: still not accepting connections on 127.0.0.1:5432 after ${WAIT_SECONDS} s; PostgreSQL tests will be skipped"
    else
        exists=$(psql_q -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")
        if [ "$exists" != "1" ]; then
            say "PostgreSQL: creating database test"
            psql_q -d postgres -c "CREATE DATABASE test" >&2
        fi
        if out=$(psql_q -d test -tAc "SELECT 1") && [ "$out" = "1" ]; then
            say "PostgreSQL: up at 127.0.0.1:5432, database test ready"
            echo "export TSR_POSTGRES_URL=$PG_URL"
        else
            say "PostgreSQL: up, but database test is not usable: $out; PostgreSQL tests will be skipped"
        fi
    fi
fi

if [ "$mysql_wanted" = 1 ]; then
    if [ "$mysql_ready" = 0 ]; then
        say "MariaDB: still not accepting connections on 127.0.0.1:3306 after ${WAIT_SECONDS} s; MySQL tests will be skipped"
    else
        if out=$(mysql_q -N -e "CREATE DATABASE IF NOT EXISTS test; USE test; SELECT 1") &&
            [ "$out" = "1" ]; then
            say "MariaDB: up at 127.0.0.1:3306, database test ready"
            echo "export TSR_MYSQL_URL=$MYSQL_URL"
        else
            say "MariaDB: up, but database test is not usable: $out; MySQL tests will be skipped"
        fi
    fi
fi

exit 0
