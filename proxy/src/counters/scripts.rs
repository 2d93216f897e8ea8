//! The server-side scripts of the shared counters: each check-and-charge runs as one Lua
//! script in Redis, so replicas racing on one session or one rate key cannot together pass
//! a limit (Redis runs one script at a time).
//!
//! An account is a hash `<prefix>:acct:<session>`: limits `mc` (calls), `mk` (cost, micro
//! units), `ms`/`mr` (bytes sent/received), `-1` for none; usage `c`, `k`, `s`, `r`; the
//! budget carved for live children `cc`, `ck`; the parent's id `p` (empty for a root).
//! Numbers are Lua doubles inside a script: exact up to 2^53, i.e. costs up to nine billion
//! currency units; increments themselves are Redis integers (`HINCRBY`), and a number a
//! script stores is formatted as an integer (`%d`), never in Lua's exponent notation.

/// Open an account unless it exists. KEYS: account. ARGV: mc mk ms mr parent ttl_ms.
pub const OPEN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'mc', ARGV[1], 'mk', ARGV[2], 'ms', ARGV[3], 'mr', ARGV[4],
  'p', ARGV[5], 'c', 0, 'k', 0, 's', 0, 'r', 0, 'cc', 0, 'ck', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
";

/// Add this replica's unsynced bytes to a session and each ancestor, and read the chain.
/// KEYS: the session's account. ARGV: account key prefix, session id, sent, received.
/// Returns one row per account, nearest first: id mc mk ms mr c k s r cc ck pz (the pause,
/// JSON, or empty).
pub const SYNC: &str = r"
local rows = {}
local key, id = KEYS[1], ARGV[2]
local sent, received = tonumber(ARGV[3]), tonumber(ARGV[4])
for _ = 1, 64 do
  if redis.call('EXISTS', key) == 0 then break end
  if sent > 0 then redis.call('HINCRBY', key, 's', sent) end
  if received > 0 then redis.call('HINCRBY', key, 'r', received) end
  local a = redis.call('HMGET', key, 'mc', 'mk', 'ms', 'mr', 'c', 'k', 's', 'r', 'cc', 'ck', 'p', 'pz')
  rows[#rows + 1] = {id, a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[12] or ''}
  if not a[11] or a[11] == '' then break end
  id = a[11]
  key = ARGV[1] .. id
end
return rows
";

/// Charge one call. KEYS: account. ARGV: cost micros, enforce (`1`) or not (`0`, approved).
/// Returns {status, calls, cost, max calls less carved, max cost less carved}; status 0
/// charged, 1 calls spent, 2 cost would pass, -1 no such account.
pub const CHARGE: &str = r"
local a = redis.call('HMGET', KEYS[1], 'mc', 'mk', 'c', 'k', 'cc', 'ck')
if not a[1] then return {-1, 0, 0, 0, 0} end
local mc, mk, c, k = tonumber(a[1]), tonumber(a[2]), tonumber(a[3]), tonumber(a[4])
local cc, ck = tonumber(a[5]), tonumber(a[6])
local cost = tonumber(ARGV[1])
if ARGV[2] == '1' then
  if mc >= 0 and mc - c - cc <= 0 then return {1, c, k, math.max(mc - cc, 0), mk - ck} end
  if mk >= 0 and cost > math.max(mk - k - ck, 0) then return {2, c, k, mc - cc, mk - ck} end
end
c = redis.call('HINCRBY', KEYS[1], 'c', 1)
k = redis.call('HINCRBY', KEYS[1], 'k', cost)
return {0, c, k, mc - cc, mk - ck}
";

/// Carve a child's calls and cost out of its parent's remainder. KEYS: parent's account.
/// ARGV: asked calls, asked cost (`-1`: half of what is left). Returns {0, calls, cost, ms,
/// mr, s, r} (the parent's byte limits and usage, for clamping), {1|2, wanted, left} when
/// the parent cannot give it, {-1} without an account.
pub const CARVE: &str = r"
local a = redis.call('HMGET', KEYS[1], 'mc', 'mk', 'c', 'k', 'cc', 'ck', 'ms', 'mr', 's', 'r')
if not a[1] then return {-1} end
local mc, mk, c, k = tonumber(a[1]), tonumber(a[2]), tonumber(a[3]), tonumber(a[4])
local cc, ck = tonumber(a[5]), tonumber(a[6])
local calls, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
if mc >= 0 then
  local left = math.max(mc - c - cc, 0)
  if calls < 0 then calls = math.max(math.floor(left / 2), 1) end
  if calls > left or calls == 0 then return {1, calls, left} end
end
if mk >= 0 then
  local left = math.max(mk - k - ck, 0)
  if cost < 0 then cost = math.max(math.floor(left / 2), 1) end
  if cost > left or cost == 0 then return {2, cost, left} end
end
if mc >= 0 then redis.call('HINCRBY', KEYS[1], 'cc', calls) end
if mk >= 0 then redis.call('HINCRBY', KEYS[1], 'ck', cost) end
return {0, calls, cost, a[7], a[8], a[9], a[10]}
";

/// Give back a carve whose child was never created. KEYS: parent. ARGV: calls, cost (`-1`
/// for none).
pub const UNCARVE: &str = r"
local a = redis.call('HMGET', KEYS[1], 'mc', 'mk', 'cc', 'ck')
if not a[1] then return 0 end
if tonumber(a[1]) >= 0 and tonumber(ARGV[1]) >= 0 then
  redis.call('HSET', KEYS[1], 'cc', string.format('%d', math.max(tonumber(a[3]) - tonumber(ARGV[1]), 0)))
end
if tonumber(a[2]) >= 0 and tonumber(ARGV[2]) >= 0 then
  redis.call('HSET', KEYS[1], 'ck', string.format('%d', math.max(tonumber(a[4]) - tonumber(ARGV[2]), 0)))
end
return 1
";

/// Close an account: the parent gets back its carve and takes the child's usage, the
/// parent's child count drops, the account goes. Once: a second close finds nothing.
/// KEYS: account. ARGV: account key prefix, children key prefix. Returns mc mk ms mr c k s r
/// cc ck p, or an empty list.
pub const CLOSE: &str = r"
local a = redis.call('HMGET', KEYS[1], 'mc', 'mk', 'ms', 'mr', 'c', 'k', 's', 'r', 'cc', 'ck', 'p')
if not a[1] then return {} end
local p = a[11]
if p and p ~= '' then
  local pk = ARGV[1] .. p
  if redis.call('EXISTS', pk) == 1 then
    local pa = redis.call('HMGET', pk, 'cc', 'ck')
    if tonumber(a[1]) >= 0 then
      redis.call('HSET', pk, 'cc', string.format('%d', math.max(tonumber(pa[1]) - tonumber(a[1]), 0)))
      redis.call('HINCRBY', pk, 'c', a[5])
    end
    if tonumber(a[2]) >= 0 then
      redis.call('HSET', pk, 'ck', string.format('%d', math.max(tonumber(pa[2]) - tonumber(a[2]), 0)))
      redis.call('HINCRBY', pk, 'k', a[6])
    end
  end
  local kids = ARGV[2] .. p
  if tonumber(redis.call('GET', kids) or '0') > 0 then redis.call('DECR', kids) end
end
redis.call('DEL', KEYS[1])
return a
";

/// Pause a session (`pz`, the pause as JSON) or lift its pause (empty). KEYS: account.
/// ARGV[2] `refresh`: replace a pause only if one is still there (a replica completing its
/// own pause must not undo a resume another replica made meanwhile). Returns 1 if written.
pub const PAUSE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[2] == 'refresh' and redis.call('HEXISTS', KEYS[1], 'pz') == 0 then return 0 end
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'pz') else redis.call('HSET', KEYS[1], 'pz', ARGV[1]) end
return 1
";

/// An approver doubled a limit. KEYS: account. ARGV: `mc` or `mk`. Returns 1 if raised.
pub const GRANT: &str = r"
local v = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if v < 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', math.max(v * 2, 1)))
return 1
";

/// GCRA on Redis's clock (replicas' clocks may differ; Redis's is one). KEYS: the rate
/// key. ARGV: interval µs, tolerance µs. Returns 0 when admitted, else µs to wait.
pub const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local allowed = tat - tonumber(ARGV[2])
if now < allowed then return allowed - now end
local new = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1000)
return 0
";

/// Count one more child of a parent unless it has `max`. KEYS: the parent's child count.
/// ARGV: max, ttl ms. Returns -1 when counted, else the count that refused it.
pub const SPAWN: &str = r"
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return n end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return -1
";

/// Give back a child count whose child was never created. KEYS: the parent's child count.
pub const UNSPAWN: &str = r"
if tonumber(redis.call('GET', KEYS[1]) or '0') > 0 then redis.call('DECR', KEYS[1]) end
return 1
";
