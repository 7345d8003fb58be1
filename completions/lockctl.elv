
use builtin;
use str;

set edit:completion:arg-completer[lockctl] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'lockctl'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'lockctl'= {
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand acquire 'Acquire a lock and print its token'
            cand release 'Release a lock, only if TOKEN still holds it'
            cand renew 'Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms'
            cand exec 'Run a command while holding the lock, renewing it, and release it afterwards'
            cand status 'Show who holds a lock (exit 0 held, 1 free)'
            cand list 'List held locks whose name matches a glob'
            cand break 'Delete a lock whoever holds it (operator override)'
            cand doctor 'Check the nodes for hazards that break locks'
            cand completions 'Print a shell completion script'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'lockctl;acquire'= {
            cand --ttl 'Lease time to live'
            cand -w 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]'
            cand --wait 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]'
            cand -E 'Exit code when the lock is busy, instead of 75'
            cand --conflict-exit-code 'Exit code when the lock is busy, instead of 75'
            cand --limit 'Slots: up to N holders at once (a counting semaphore) [1..=1000]'
            cand --note 'Free text kept with the holder and waiter records (a CI job URL, a ticket)'
            cand --format 'Output: plain prints the token; env prints `export` lines for eval; json prints an object'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -n 'One attempt: fail at once if the lock is busy'
            cand --no-wait 'One attempt: fail at once if the lock is busy'
            cand --supersede 'Newest wins among waiters: displace the older waiters of NAME'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;release'= {
            cand --token 'The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;renew'= {
            cand --token 'The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]'
            cand --ttl 'New time to live from now [default: the TTL of the grant; 30s for a lock lockctl did not grant]'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;exec'= {
            cand --ttl 'Lease time to live'
            cand -w 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]'
            cand --wait 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]'
            cand -E 'Exit code when the lock is busy, instead of 75'
            cand --conflict-exit-code 'Exit code when the lock is busy, instead of 75'
            cand --limit 'Slots: up to N holders at once (a counting semaphore) [1..=1000]'
            cand --note 'Free text kept with the holder and waiter records (a CI job URL, a ticket)'
            cand --kill-after 'After SIGTERM, wait this long before SIGKILL'
            cand -c 'Run COMMAND with `sh -c`'
            cand --command 'Run COMMAND with `sh -c`'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -n 'One attempt: fail at once if the lock is busy'
            cand --no-wait 'One attempt: fail at once if the lock is busy'
            cand --supersede 'Newest wins among waiters: displace the older waiters of NAME'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;status'= {
            cand --format 'Output format'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;list'= {
            cand --format 'Output format'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;break'= {
            cand --token 'Break only the holder with this token (one slot of a --limit N semaphore) [default: every holder]'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -y 'Do not ask; required when stdin is not a terminal'
            cand --yes 'Do not ask; required when stdin is not a terminal'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;doctor'= {
            cand --ttl 'The lease TTL your jobs use (uptime and latency are judged against it)'
            cand --format 'Output format'
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;completions'= {
            cand -r 'Redis node URL; repeat for Redlock over several masters'
            cand --redis 'Redis node URL; repeat for Redlock over several masters'
            cand --redis-file 'File with the node URLs, one per line, instead of --redis'
            cand --prefix 'Key prefix for lock keys'
            cand --node-timeout 'Bound on connecting to, and on each command to, one node'
            cand --tls-ca 'CA certificate (PEM) to verify rediss:// servers instead of the system roots'
            cand --tls-cert 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)'
            cand --tls-key 'Private key (PEM) of the client certificate (with --tls-cert)'
            cand --drift-factor 'Clock drift allowance as a fraction of the TTL'
            cand --quarantine 'Nodes up for less than this do not vote [default: the TTL]'
            cand -q 'No diagnostics on stderr (results and errors still print)'
            cand --quiet 'No diagnostics on stderr (results and errors still print)'
            cand -v 'Log each step with its timing on stderr'
            cand --verbose 'Log each step with its timing on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'lockctl;help'= {
            cand acquire 'Acquire a lock and print its token'
            cand release 'Release a lock, only if TOKEN still holds it'
            cand renew 'Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms'
            cand exec 'Run a command while holding the lock, renewing it, and release it afterwards'
            cand status 'Show who holds a lock (exit 0 held, 1 free)'
            cand list 'List held locks whose name matches a glob'
            cand break 'Delete a lock whoever holds it (operator override)'
            cand doctor 'Check the nodes for hazards that break locks'
            cand completions 'Print a shell completion script'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'lockctl;help;acquire'= {
        }
        &'lockctl;help;release'= {
        }
        &'lockctl;help;renew'= {
        }
        &'lockctl;help;exec'= {
        }
        &'lockctl;help;status'= {
        }
        &'lockctl;help;list'= {
        }
        &'lockctl;help;break'= {
        }
        &'lockctl;help;doctor'= {
        }
        &'lockctl;help;completions'= {
        }
        &'lockctl;help;help'= {
        }
    ]
    $completions[$command]
}
