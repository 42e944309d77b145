-- tollgate's one script: a batch of operations on the security
-- counters shared by every host, run atomically by the store. Loaded by SHA
-- (EVALSHA), reloaded on NOSCRIPT. No modules: managed services cannot load
-- them.
--
-- ARGV[1] = number of ops; then each op: its kind, its argument count,
-- its key count, its arguments. KEYS holds every op's keys in op order.
-- The ops of the request path (check, report, release, merge) take one
-- argument, their numbers packed little-endian (struct), and reply with one
-- string of int64s: a few hundred decimal arguments and integer replies per
-- batch cost the store more to convert than the decisions cost (measured:
-- docs/performance.md, "Shared mode"). The others take and give plain
-- values. An op that finds a value tollgate did not write answers
-- {-code, rule} (1: not a tollgate value, 2: wrong type) and writes nothing;
-- one the script fails on answers {-3, 0}; a check past the batch's
-- deadline (the last argument) answers {-4, now}.
--
-- Time is the store's (TIME), read once per batch: with one clock per key,
-- skew between hosts changes nothing in a decision. Every time and count
-- is an integer under 2^53 (store microseconds are about 1.8e15), so Lua's
-- doubles hold them exactly. A weighted count (count x window) can pass
-- 2^53 with a day-long window and a huge count; it is then far above any
-- threshold, so the rounding cannot change a decision.
--
-- A failure entry is one string: struct '<BdI4I4I4ddH' (version 1, window
-- length W, window index w, previous and current counts, lock-until,
-- unlocked-at), then one double per attempt in flight: the instant its
-- place lapses. It carries a TTL at the last instant it means anything.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- The last argument: the store's time after which a check of this batch
-- takes no place (0: none). Its host has stopped waiting for the reply by
-- then and could not give a place back: a store that ran a stalled
-- queue of checks would hold places nobody uses until they lapse.
local checks_until = tonumber(ARGV[#ARGV])
local HDR, HLEN = '<BdI4I4I4ddH', 39
local a, k = 2, 1

local function num()
  local v = tonumber(ARGV[a]); a = a + 1; return v
end
local function str()
  local v = ARGV[a]; a = a + 1; return v
end
local function key()
  local v = KEYS[k]; k = k + 1; return v
end

-- The packed argument of the op being run, and the read position in it.
local blob, at = '', 1

-- struct formats made once per length in a batch: n int64s (a release's
-- windows, a reply), n doubles (the places of an entry), an entry's
-- header and n places. One
-- pack or unpack of the whole entry costs the script a fraction of one per
-- place.
local places_formats, entry_formats, int64s_formats = {}, {}, {}
local function int64s_format(n)
  local f = int64s_formats[n]
  if not f then f = '<' .. string.rep('i8', n); int64s_formats[n] = f end
  return f
end
local function places_format(n)
  local f = places_formats[n]
  if not f then f = '<' .. string.rep('d', n); places_formats[n] = f end
  return f
end
local function entry_format(n)
  local f = entry_formats[n]
  if not f then f = HDR .. string.rep('d', n); entry_formats[n] = f end
  return f
end

-- floor(at / W), corrected for the rounding of a double division.
local function widx(W, at)
  local w = math.floor(at / W)
  if w * W > at then w = w - 1 elseif (w + 1) * W <= at then w = w + 1 end
  return w
end

-- A failure entry, or nil and an error code. An entry written under
-- another window length is re-dated as the daemon re-dates its own rows:
-- its whole failures, rounded down, into the current window.
local function load(kn, W)
  local v = redis.pcall('GET', kn)
  if type(v) == 'table' and v.err then return nil, 2 end
  if not v then return { W = W, w = widx(W, now), p = 0, c = 0, lu = 0, ua = 0, q = {}, absent = true } end
  if #v < HLEN then return nil, 1 end
  local ver, SW, w, p, c, lu, ua, n, pos = struct.unpack(HDR, v)
  if ver ~= 1 or SW <= 0 or n > 1000 or #v ~= HLEN + 8 * n then return nil, 1 end
  local q = {}
  if n > 0 then
    -- The places, then the position after them (not kept).
    local xs = { struct.unpack(places_format(n), v, pos) }
    for j = 1, n do
      if xs[j] > now then q[#q + 1] = xs[j] end
    end
  end
  local r = { W = SW, w = w, p = p, c = c, lu = lu, ua = ua, q = q }
  if SW ~= W then
    local i = widx(SW, now)
    if i == r.w + 1 then r.p, r.c = r.c, 0 elseif i > r.w + 1 then r.p, r.c = 0, 0 end
    local e = math.min(now - i * SW, SW)
    local whole = math.floor((r.p * (SW - e) + r.c * SW) / SW)
    r.W, r.w, r.p, r.c = W, widx(W, now), 0, whole
  end
  return r
end

local function roll(r)
  local i = widx(r.W, now)
  if i == r.w + 1 then r.p, r.c = r.c, 0 elseif i > r.w + 1 then r.p, r.c = 0, 0 end
  r.w = i
end

local function weighted(r)
  local e = math.min(now - r.w * r.W, r.W)
  return r.p * (r.W - e) + r.c * r.W
end

local function locked(r, T)
  return r.lu > now or weighted(r) >= T * r.W
end

local function save(kn, r)
  local last = 0
  for _, x in ipairs(r.q) do if x > last then last = x end end
  local keep = 0
  if r.ua > 0 then keep = r.ua + 2 * r.W end
  local exp = math.max((r.w + 2) * r.W, r.lu, last, keep)
  if (r.p + r.c == 0 and r.lu <= now and #r.q == 0 and r.ua == 0) or exp <= now then
    -- Nothing to keep. A key that was not there needs no DEL (a success
    -- on an account with no failures, nine reports in ten).
    if not r.absent then redis.call('DEL', kn) end
    return
  end
  local value = struct.pack(entry_format(#r.q), 1, r.W, r.w, r.p, r.c, r.lu, r.ua, #r.q, unpack(r.q))
  -- An integer formatted as one: a number passed as it is would be
  -- printed as a double (%.17g), which costs the store more.
  redis.call('SET', kn, value, 'PXAT', string.format('%d', math.ceil(exp / 1000)))
end

-- Releases the newest place: a report settles the place its check took,
-- and the newest is the one least likely to be another attempt's.
local function pop_newest(r)
  local bi, bx = 0, 0
  for i, x in ipairs(r.q) do if x > bx then bi, bx = i, x end end
  if bi > 0 then table.remove(r.q, bi) end
end

-- Seven integers per failure rule: w, p, c, places in flight, time until
-- the first lapses, time until lock-until, W.
local function standing(r, out)
  local first = 0
  for _, x in ipairs(r.q) do if first == 0 or x < first then first = x end end
  out[#out + 1] = r.w
  out[#out + 1] = r.p
  out[#out + 1] = r.c
  out[#out + 1] = #r.q
  out[#out + 1] = (first > 0) and (first - now) or 0
  out[#out + 1] = math.max(r.lu - now, 0)
  out[#out + 1] = r.W
end

local function gcra_tat(kn)
  local v = redis.pcall('GET', kn)
  if type(v) == 'table' and v.err then return nil, 2 end
  if not v then return now end
  local tat = tonumber(v)
  if not tat or tat ~= math.floor(tat) or tat < 0 then return nil, 1 end
  return math.max(tat, now)
end

-- CHECK: take a place on every failure rule and spend on every rate rule,
-- all or nothing. Pass 1 reads and decides; pass 2 writes only when no
-- enforced rule refused, so a refused check holds nothing and nothing has
-- to be given back over the network.
-- Whether a rule scoped to devices applies: scope 0 always, 1 to devices
-- no host has seen log in (the account ceiling: the owner's device is
-- exempt on every host), 2 to known devices only.
local function applies(scope, known)
  return scope == 0 or (scope == 1 and not known) or (scope == 2 and known)
end

local function check()
  if checks_until > 0 and now > checks_until then return { -4, now } end
  local n
  n, at = struct.unpack('<B', blob, at)
  local recs, refused, out = {}, false, { 0, now }
  local known = false
  for i = 1, n do
    local kind, scope, W, T, timeout, mon, interval, tolerance
    kind, at = struct.unpack('c1', blob, at)
    local kn = key()
    if kind == 'f' then
      scope, W, T, timeout, mon, at = struct.unpack('<Bi8I4i8B', blob, at)
    elseif kind == 'g' then
      scope, interval, tolerance, mon, at = struct.unpack('<Bi8i8B', blob, at)
    end
    if kind == 'd' then
      -- The (account, device) key: known if any host saw it log in.
      known = redis.call('EXISTS', kn) == 1
    elseif not applies(scope, known) then
      -- Skipped: it answers 2.
      out[#out + 1] = 2
    elseif kind == 'f' then
      local r, err = load(kn, W)
      if not r then return { -err, i } end
      roll(r)
      local refuses = r.lu > now or (weighted(r) + #r.q * W >= T * W)
      recs[i] = { kn = kn, r = r, take = not refuses, timeout = timeout }
      if refuses and mon == 0 then refused = true end
      out[#out + 1] = refuses and 1 or 0
      standing(r, out)
    else
      local tat, err = gcra_tat(kn)
      if not tat then return { -err, i } end
      local ok = tat + interval - tolerance <= now
      recs[i] = { kn = kn, gcra = true, ok = ok, tat = tat + interval }
      if not ok and mon == 0 then refused = true end
      out[#out + 1] = ok and 0 or 1
      out[#out + 1] = tat
    end
  end
  if not refused then
    for _, x in pairs(recs) do
      if x.gcra then
        if x.ok then redis.call('SET', x.kn, string.format('%d', x.tat), 'PXAT', math.ceil(x.tat / 1000)) end
      elseif x.take then
        x.r.q[#x.r.q + 1] = now + x.timeout
        save(x.kn, x.r)
      end
    end
    out[1] = 1
  end
  return out
end

-- REPORT: settle the attempt's place, count the failure, say whether the
-- key was locked before and is now. Rate rules are only read.
local function report()
  local n
  n, at = struct.unpack('<B', blob, at)
  local recs, out = {}, { 0, now }
  local known = false
  local remember = nil
  for i = 1, n do
    local kind, scope, W, T, release, count, clear
    kind, at = struct.unpack('c1', blob, at)
    local kn = key()
    if kind == 'f' or kind == 'F' then
      scope, W, T, release, count, clear, at = struct.unpack('<Bi8I4BBB', blob, at)
    elseif kind == 'g' then
      scope, at = struct.unpack('<B', blob, at)
    end
    if kind == 'd' then
      known = redis.call('EXISTS', kn) == 1
      recs[i] = { skip = true }
    elseif kind == 'D' then
      -- A success: the device becomes known to every host, while the
      -- account is under its cap of new devices (the next key counts them).
      local ttl, max
      ttl, max, at = struct.unpack('<i8H', blob, at)
      remember = { kn = kn, ck = key(), ttl = ttl, max = max }
      recs[i] = { skip = true }
    elseif not applies(scope, known) then
      if kind == 'F' then key() end
      recs[i] = { skipped = true }
    elseif kind == 'f' or kind == 'F' then
      -- 'F': the rule is keyed on the account and something else; its
      -- account's index (the next key) lists its entries, so an unlock of
      -- the whole account finds them.
      local ix = nil
      if kind == 'F' then
        ix = key()
        -- Checked before anything is written: a write that fails midway
        -- would abort the whole batch and keep what was written. Only a
        -- failure writes the index.
        if count == 1 then
          local t = redis.call('TYPE', ix)['ok']
          if t ~= 'none' and t ~= 'set' then return { -2, i } end
        end
      end
      local r, err = load(kn, W)
      if not r then return { -err, i } end
      recs[i] = { kn = kn, ix = ix, r = r, T = T, release = release, count = count, clear = clear }
    else
      local tat, err = gcra_tat(kn)
      if not tat then return { -err, i } end
      recs[i] = { tat = tat }
    end
  end
  local locks = 0
  for i = 1, n do
    local x = recs[i]
    if x.skip then
      -- the device elements answer nothing
    elseif x.skipped then
      out[#out + 1] = 2
    elseif x.tat then
      out[#out + 1] = 0
      out[#out + 1] = 0
      out[#out + 1] = x.tat
    else
      local r = x.r
      roll(r)
      if x.release == 1 then pop_newest(r) end
      local was = locked(r, x.T)
      if x.count == 1 then
        r.c = math.min(r.c + 1, 1000000)
        if x.ix then
          redis.call('SADD', x.ix, x.kn)
          redis.call('PEXPIRE', x.ix, math.ceil(2 * r.W / 1000))
        end
      end
      if x.clear == 1 then r.p, r.c, r.lu = 0, 0, 0 end
      local is = locked(r, x.T)
      save(x.kn, r)
      if is and not was then locks = locks + 1 end
      out[#out + 1] = was and 1 or 0
      out[#out + 1] = is and 1 or 0
      standing(r, out)
    end
  end
  if remember then
    local ttl_ms = math.ceil(remember.ttl / 1000)
    if redis.call('EXISTS', remember.kn) == 1 then
      -- Never shortened: a host teaching a store that lost its data sends
      -- only what is left of the device's time there.
      if redis.call('PTTL', remember.kn) < ttl_ms then redis.call('PEXPIRE', remember.kn, ttl_ms) end
    else
      local made = redis.pcall('GET', remember.ck)
      if type(made) == 'table' then made = nil end
      made = tonumber(made) or 0
      if made < remember.max then
        redis.call('SET', remember.kn, '1', 'PX', ttl_ms)
        -- The count lasts as long as the account's longest-lived new device.
        redis.call('SET', remember.ck, made + 1, 'PX', math.max(ttl_ms, redis.call('PTTL', remember.ck)))
      end
    end
  end
  out[1] = locks
  return out
end

-- RELEASE: give back the places of a check whose answer was given locally
-- (its reply came too late) or refused by a rule on this host.
local function release()
  local n
  n, at = struct.unpack('<H', blob, at)
  -- Every window read before the first write: a short argument fails the
  -- op before it has released anything.
  local windows = { struct.unpack(int64s_format(n), blob, at) }
  for i = 1, n do
    local kn, W = key(), windows[i]
    local r, err = load(kn, W)
    if not r then return { -err, i } end
    roll(r)
    pop_newest(r)
    save(kn, r)
  end
  return { 0, now }
end

-- MERGE: a lockout a host took while it could not reach the store. The
-- lock only moves later (max), so a merge sent twice is a merge sent once;
-- an unlock newer than the lockout wins.
local function merge()
  local kn = key()
  local W, T, lock_rem, age, indexed
  W, T, lock_rem, age, indexed, at = struct.unpack('<i8I4i8i8B', blob, at)
  local ix = nil
  if indexed == 1 then ix = key() end
  -- No lockout of a sliding window outlasts its next window.
  lock_rem = math.min(lock_rem, 2 * W)
  local r, err = load(kn, W)
  if not r then return { -err, 1 } end
  roll(r)
  local applied = 0
  -- An unlock of this key, or of the whole account on this rule, made
  -- after the lockout began wins.
  local unlocked_at = r.ua
  if ix then
    local au = redis.pcall('GET', ix .. ':u')
    if type(au) == 'string' then unlocked_at = math.max(unlocked_at, tonumber(au) or 0) end
  end
  if unlocked_at < now - age and lock_rem > 0 then
    r.lu = math.max(r.lu, now + lock_rem)
    save(kn, r)
    applied = 1
    -- In the account's index, as a report's entry is: an account-wide
    -- unlock finds it.
    if ix then
      redis.call('SADD', ix, kn)
      redis.call('PEXPIRE', ix, math.ceil(2 * r.W / 1000))
    end
  end
  local out = { applied, now }
  standing(r, out)
  return out
end

-- UNLOCK: an operator's unlock, of one entry or (with an index) of every
-- entry of an account on one rule. The counts, the lock and the places in
-- flight go (a refusal made of places nobody will report is undone like
-- one made of failures; a later report finds no place, which is fine);
-- the tombstone makes an older lockout written back later lose. Each unlocked key is published,
-- so the other hosts forget it as a known lockout.
local function unlock()
  local kn, W, indexed, channel = key(), num(), num(), str()
  local names = { kn }
  if indexed == 1 then
    local t = redis.pcall('SMEMBERS', kn)
    if type(t) == 'table' and t.err then return { -2, 1 } end
    names = t
  end
  local had = 0
  for _, name in ipairs(names) do
    local r, err = load(name, W)
    if r then
      roll(r)
      if r.p + r.c > 0 or r.lu > now or #r.q > 0 then had = had + 1 end
      r.p, r.c, r.lu, r.ua, r.q = 0, 0, 0, now, {}
      save(name, r)
      redis.call('PUBLISH', channel, 'U ' .. name)
    end
  end
  if indexed == 1 then
    redis.call('DEL', kn)
    -- The account's tombstone on this rule: a lockout written back later
    -- that is older loses, also one whose key was in no index (its first
    -- merge failed, or it was taken on a host's share alone).
    redis.call('SET', kn .. ':u', now, 'PX', math.ceil(2 * W / 1000))
  end
  local out = { had, now }
  for _, name in ipairs(names) do out[#out + 1] = name end
  return out
end

-- HEARTBEAT: this host is alive; how many hosts were seen within the TTL.
local function heartbeat()
  local kn, host, ttl = key(), str(), num()
  redis.call('ZADD', kn, now, host)
  redis.call('ZREMRANGEBYSCORE', kn, '-inf', now - ttl)
  redis.call('PEXPIRE', kn, math.ceil(10 * ttl / 1000))
  return { redis.call('ZCARD', kn), now }
end

-- JOIN: record the secret's fingerprint if none is (unless create is 0),
-- and return the one recorded, so a host keyed with another secret
-- refuses to join; and since when the record is, so a host that saw
-- another time knows the store lost its data since. A host that holds
-- the record, or read one before (seen), claims the store for its
-- fingerprint until now + ttl (the next key, a sorted set of
-- 'fingerprint|host' scored by expiry). Such a host that finds no record
-- (it joins without create: refused before), or another one made since
-- the store lost its data (another since: a host keyed otherwise may have
-- reached the emptied store first), makes the record its own when more
-- live hosts claim its fingerprint than the recorded one (than any other,
-- with none recorded), keeping the since; a tie leaves it, so two never
-- take turns. Only commands the documented ACL user has.
local function join()
  local kn, ck, fp, host, ttl, seen, create = key(), key(), str(), str(), num(), str(), num()
  local kind = redis.call('TYPE', kn)['ok']
  if kind ~= 'none' and kind ~= 'hash' then return { -2, 1 } end
  if create == 1 then
    redis.call('HSETNX', kn, 'fingerprint', fp)
    redis.call('HSETNX', kn, 'schema', '1')
    redis.call('HSETNX', kn, 'since', now)
  end
  local got = redis.call('HMGET', kn, 'fingerprint', 'schema', 'since')
  local claims = redis.call('TYPE', ck)['ok']
  if (got[1] == fp or seen ~= '') and (claims == 'none' or claims == 'zset') then
    redis.call('ZADD', ck, now + ttl, fp .. '|' .. host)
    redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
    local keep = math.ceil(10 * ttl / 1000)
    if redis.call('PTTL', ck) < keep then redis.call('PEXPIRE', ck, keep) end
    local contested = got[1] and got[1] ~= fp and got[3] and got[3] ~= seen
    if seen ~= '' and (contested or not got[1]) then
      local counts = {}
      for _, member in ipairs(redis.call('ZRANGEBYSCORE', ck, now + 1, '+inf')) do
        local bar = string.find(member, '|', 1, true)
        if bar then
          local of = string.sub(member, 1, bar - 1)
          counts[of] = (counts[of] or 0) + 1
        end
      end
      local mine, most = counts[fp] or 0, 0
      for of, n in pairs(counts) do
        if of ~= fp and (of == got[1] or not got[1]) and n > most then most = n end
      end
      if mine > most then
        redis.call('DEL', kn)
        redis.call('HSETNX', kn, 'fingerprint', fp)
        redis.call('HSETNX', kn, 'schema', got[2] or '1')
        redis.call('HSETNX', kn, 'since', got[3] or now)
        got = redis.call('HMGET', kn, 'fingerprint', 'schema', 'since')
      end
    end
  end
  return { 0, now, got[1] or '', got[2] or '', got[3] or '' }
end

-- FINGERPRINT: the one recorded ('' if none), writing nothing: what a
-- host about to make a state file reads to take the hosts' derivation.
local function fingerprint()
  local kn = key()
  local kind = redis.call('TYPE', kn)['ok']
  if kind ~= 'none' and kind ~= 'hash' then return { -2, 1 } end
  return { 0, now, redis.call('HMGET', kn, 'fingerprint')[1] or '' }
end

local ops = { C = check, R = report, X = release, M = merge, U = unlock, H = heartbeat, J = join, F = fingerprint }
local packed = { C = true, R = true, X = true, M = true }
local function ints(out)
  return struct.pack(int64s_format(#out), unpack(out))
end
local replies, all_packed = {}, true
for o = 1, tonumber(ARGV[1]) do
  local kind = str()
  local op = ops[kind]
  if not op then return redis.error_reply('tollgate: unknown op ' .. tostring(kind)) end
  -- An op that errs stops reading its own arguments; the next op's are
  -- found from the counts each op carries, so the batch stays aligned.
  local a0, k0 = a, k
  local span_args, span_keys = num(), num()
  if packed[kind] then blob, at = str(), 1 end
  -- An op that fails in the script (an argument it cannot read) answers
  -- {-3, 0} on its own, and the batch's other ops still run; unguarded,
  -- the error would abort the whole batch.
  local ran, reply = pcall(op)
  if not ran then reply = { -3, 0 } end
  a, k = a0 + 2 + span_args, k0 + span_keys
  if packed[kind] then reply = ints(reply) else all_packed = false end
  replies[o] = reply
end
-- A batch of packed ops only (the request path's) answers in one string,
-- each op's int64s behind their count (u16): the driver then reads one
-- value a batch, not one an op, and reading them was most of what it spent.
if all_packed then
  for o = 1, #replies do replies[o] = struct.pack('<H', #replies[o] / 8) .. replies[o] end
  return table.concat(replies)
end
return replies
