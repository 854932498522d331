-- wrk flash-sale burst: every token in a file buys PRODUCT_ID exactly once.
--
-- Usage:
--   seckill-token --sub 1 --count 5000 > /tmp/tokens.txt
--   TOKENS=/tmp/tokens.txt PRODUCT_ID=7 wrk -t2 -c256 -d60s -s loadtest/wrk/seckill.lua \
--       http://127.0.0.1:8080
--   (or pass them as script arguments: ... -s loadtest/wrk/seckill.lua URL -- /tmp/tokens.txt 7)
--
-- One token a line (blank lines ignored); each is one buyer, sent once. The run ends as soon as
-- every purchase is answered; -d only bounds a run in which some purchase never is (make it
-- long enough). wrk's own "Requests/sec" divides by the whole run, start-up included: read the
-- script's report instead, printed last:
--   purchases sent, answered by status (202 / 409 / 410 / other), purchases/s from the first
--   purchase sent to the last answer, latency of the purchases, and one machine-readable line
--   `SECKILL_WRK_REPORT {json}` (keys below, in `done`).
--
-- How it stays honest with wrk 4.1 (Debian's):
-- * Disjoint shares. Thread i of T takes token lines i, i+T, i+2T... wrk calls setup() and then
--   init() of a thread before it creates the next one, so T cannot be learnt by counting
--   setups (thread 1 would think it is alone and take every buyer); setup() reads it from
--   wrk's command line (/proc/self/cmdline: -t/--threads, wrk's default 2) or from the
--   THREADS environment variable where there is no /proc, and done() checks that exactly T
--   threads ran.
-- * wrk calls request() once before the run to check that it returns a valid request: that
--   call gets a copy of the thread's first purchase and uses up nothing.
-- * No filler. A connection asks delay() before each request: while its thread has buyers
--   left, delay() reserves one and says 0; then it parks the connection (24 h) instead of
--   letting wrk send anything else.
-- * A thread stops once each of its purchases was answered; the last thread to finish ends
--   the run the way Ctrl-C does (SIGINT to wrk itself, through LuaJIT's ffi).

local SIGINT = 2
local CLOCK_MONOTONIC = 1 -- Linux
local PARK_MS = 24 * 3600 * 1000

local ffi_ok, ffi = pcall(require, "ffi")
if ffi_ok then
  ffi_ok = pcall(ffi.cdef, [[
    typedef struct { long tv_sec; long tv_nsec; } seckill_timespec;
    int clock_gettime(int clock_id, seckill_timespec *tp);
    int getpid(void);
    int kill(int pid, int sig);
  ]])
end

-- Seconds on a clock every thread shares; nil without LuaJIT's ffi.
local function now()
  if not ffi_ok then
    return nil
  end
  local ts = ffi.new("seckill_timespec")
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) / 1e9
end

-- `-t`/`--threads` as wrk's getopt_long reads it (bundled short options, `-t2`, `-t 2`,
-- `--threads=2`, `--threads 2`, unique prefixes of long names); wrk's default is 2.
local function threads_from_cmdline()
  local file = io.open("/proc/self/cmdline", "rb")
  if not file then
    return nil
  end
  local raw = file:read("*a")
  file:close()
  local argv = {}
  for arg in raw:gmatch("([^%z]*)%z") do
    table.insert(argv, arg)
  end
  local with_value = { t = true, c = true, d = true, s = true, H = true, T = true }
  local long_names = { "connections", "duration", "threads", "script", "header", "latency",
    "timeout", "help", "version" }
  local long_with_value = { connections = true, duration = true, threads = true,
    script = true, header = true, timeout = true }
  local threads = "2"
  local i = 2
  while i <= #argv do
    local arg = argv[i]
    if arg == "--" then
      break
    elseif arg:sub(1, 2) == "--" then
      local name, value = arg:sub(3):match("^([^=]*)=?(.*)$")
      local has_value = arg:find("=", 1, true) ~= nil
      local full
      for _, candidate in ipairs(long_names) do
        if candidate:sub(1, #name) == name then
          if candidate == name or not full then
            full = candidate
          end
        end
      end
      if full and long_with_value[full] and not has_value then
        i = i + 1
        value = argv[i]
      end
      if full == "threads" then
        threads = value
      end
    elseif arg:sub(1, 1) == "-" and #arg > 1 then
      local j = 2
      while j <= #arg do
        local option = arg:sub(j, j)
        if with_value[option] then
          local value = arg:sub(j + 1)
          if value == "" then
            i = i + 1
            value = argv[i]
          end
          if option == "t" then
            threads = value
          end
          break
        end
        j = j + 1
      end
    end
    i = i + 1
  end
  -- wrk accepts SI suffixes (1k); nobody runs a thousand threads, but read it as wrk does.
  local digits, unit = tostring(threads):match("^(%d+)([kKmMgG]?)$")
  if not digits then
    return nil
  end
  local scale = ({ [""] = 1, k = 1e3, K = 1e3, m = 1e6, M = 1e6, g = 1e9, G = 1e9 })[unit]
  return tonumber(digits) * scale
end

-- Setup environment (wrk's main Lua state): number each thread and give it the count. These
-- locals exist in every state, but only the main one fills them; a thread sees the globals
-- `thread_index`, `thread_count` and `done_file` that setup() set in it.
local threads = {}
local run_threads
local run_done_file

function setup(thread)
  if not run_threads then
    run_threads = tonumber(os.getenv("THREADS") or "") or threads_from_cmdline()
    assert(run_threads, "cannot read wrk's thread count: set THREADS to wrk's -t value")
    run_done_file = os.tmpname()
  end
  table.insert(threads, thread)
  -- Only the thread being set up is touched: it has not started yet.
  thread:set("thread_index", #threads)
  thread:set("thread_count", run_threads)
  thread:set("done_file", run_done_file)
end

-- Thread environment from here on (one Lua state per wrk thread).
local purchases = {}
local next_purchase = 1
local reserved = 0
local running = false
local finished = false
local filler
local path

function init(args)
  local tokens_path = args[1] or os.getenv("TOKENS")
  local product_id = args[2] or os.getenv("PRODUCT_ID")
  assert(tokens_path, "set TOKENS (a file of tokens from `seckill-token --count N`)")
  assert(product_id, "set PRODUCT_ID")
  path = "/api/seckill/" .. product_id

  local buyers = 0
  for line in io.lines(tokens_path) do
    local token = line:match("^%s*(.-)%s*$")
    if token ~= "" then
      buyers = buyers + 1
      if (buyers - 1) % thread_count == thread_index - 1 then
        local headers = { ["Authorization"] = "Bearer " .. token }
        -- An empty body makes wrk send Content-Length: 0.
        table.insert(purchases, wrk.format("POST", path, headers, ""))
      end
    end
  end
  filler = wrk.format("GET", "/healthz")
  -- Read back by done() through thread:get, which copies numbers, strings and booleans
  -- safely (wrk 4.1 crashes copying a table out of a thread): `r_status_<code>` counts each
  -- status, `r_codes` lists the codes seen.
  r_buyers = buyers
  r_share = #purchases
  r_sent = 0
  r_answered = 0
  r_filler_sent = 0
  r_filler_answered = 0
  r_finished = false
  r_codes = ""
end

-- Ends this thread, and the run when it is the last one: every thread appends a byte to a file
-- shared by the run; the one whose append made it `thread_count` long was the last.
local function finish()
  if finished then
    return
  end
  finished = true
  r_finished = true
  local file = io.open(done_file, "ab")
  if file then
    file:write("x")
    file:close()
    local check = io.open(done_file, "rb")
    local size = check and check:seek("end") or 0
    if check then
      check:close()
    end
    if size >= thread_count and ffi_ok then
      ffi.C.kill(ffi.C.getpid(), SIGINT)
    end
  end
  wrk.thread:stop()
end

local function all_answered()
  return next_purchase > #purchases and r_answered >= r_sent
end

function delay()
  running = true
  if next_purchase + reserved <= #purchases then
    reserved = reserved + 1
    return 0
  end
  if all_answered() then
    finish()
  end
  return PARK_MS
end

function request()
  if not running then
    -- wrk's check of the script before the run: nothing is sent.
    return purchases[1] or filler
  end
  if reserved > 0 then
    reserved = reserved - 1
  end
  local purchase = purchases[next_purchase]
  if purchase then
    next_purchase = next_purchase + 1
    r_sent = r_sent + 1
    r_first_sent_at = r_first_sent_at or now()
    return purchase
  end
  -- Only after a connection broke mid-request (wrk then asks again without delay()): every
  -- buyer is already sent, so ask something harmless and leave it out of the counts.
  r_filler_sent = r_filler_sent + 1
  return filler
end

function response(status, headers, body)
  -- A purchase never answers 200 (success is 202): a 200 answers a filler health check.
  if status == 200 then
    r_filler_answered = r_filler_answered + 1
    return
  end
  local key = "r_status_" .. status
  local seen = _G[key]
  if not seen then
    r_codes = r_codes .. (r_codes == "" and "" or ",") .. status
  end
  _G[key] = (seen or 0) + 1
  r_answered = r_answered + 1
  r_last_answer_at = now()
  if all_answered() then
    finish()
  end
end

-- Back in the setup environment, after every thread stopped.

local function json_string(s)
  return '"' .. tostring(s):gsub('[%c"\\]', function(c)
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

local list_marker = {}

-- A table that to_json writes as a JSON array, even when empty.
local function list(items)
  return setmetatable(items, list_marker)
end

-- Minimal JSON for numbers, booleans, strings, lists and string-keyed tables (keys sorted).
local function to_json(value)
  local kind = type(value)
  if kind == "table" and getmetatable(value) == list_marker then
    local parts = {}
    for _, item in ipairs(value) do
      table.insert(parts, to_json(item))
    end
    return "[" .. table.concat(parts, ",") .. "]"
  elseif kind == "table" then
    local keys = {}
    for key in pairs(value) do
      table.insert(keys, key)
    end
    table.sort(keys)
    local parts = {}
    for _, key in ipairs(keys) do
      table.insert(parts, json_string(key) .. ":" .. to_json(value[key]))
    end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif kind == "number" then
    if value ~= value or value == math.huge or value == -math.huge then
      return "null"
    end
    if value == math.floor(value) and math.abs(value) < 2 ^ 53 then
      return string.format("%d", value)
    end
    return string.format("%.3f", value)
  elseif kind == "boolean" then
    return tostring(value)
  elseif kind == "nil" then
    return "null"
  end
  return json_string(value)
end

function done(summary, latency, requests)
  if run_done_file then
    os.remove(run_done_file)
  end
  local total = {
    buyers = 0,
    share_sum = 0,
    sent = 0,
    answered = 0,
    filler_sent = 0,
    filler_answered = 0,
    threads_finished = 0,
  }
  local by_status = {}
  local first, last
  local problems = {}
  for index, thread in ipairs(threads) do
    local function get(name, default)
      local value = thread:get(name)
      if value == nil then
        return default
      end
      return value
    end
    local buyers = get("r_buyers", 0)
    if index == 1 then
      total.buyers = buyers
    elseif buyers ~= total.buyers then
      table.insert(problems, "threads read different token files")
    end
    total.share_sum = total.share_sum + get("r_share", 0)
    total.sent = total.sent + get("r_sent", 0)
    total.answered = total.answered + get("r_answered", 0)
    total.filler_sent = total.filler_sent + get("r_filler_sent", 0)
    total.filler_answered = total.filler_answered + get("r_filler_answered", 0)
    if get("r_finished", false) then
      total.threads_finished = total.threads_finished + 1
    end
    for status in get("r_codes", ""):gmatch("[^,]+") do
      by_status[status] = (by_status[status] or 0) + get("r_status_" .. status, 0)
    end
    local first_sent, last_answer = get("r_first_sent_at"), get("r_last_answer_at")
    if first_sent and (not first or first_sent < first) then
      first = first_sent
    end
    if last_answer and (not last or last_answer > last) then
      last = last_answer
    end
  end
  if #threads ~= run_threads then
    table.insert(problems, string.format(
      "wrk ran %d threads but the script split the buyers for %d (set THREADS to -t)",
      #threads, run_threads or 0))
  end
  if total.share_sum ~= total.buyers then
    table.insert(problems, string.format("shares add up to %d of %d buyers",
      total.share_sum, total.buyers))
  end

  local statuses = { ["202"] = 0, ["409"] = 0, ["410"] = 0, other = 0 }
  for status, n in pairs(by_status) do
    if statuses[status] then
      statuses[status] = statuses[status] + n
    else
      statuses.other = statuses.other + n
    end
  end

  -- Without ffi there is no shared clock: fall back on wrk's run time (start-up included).
  local seconds = (first and last and last > first) and (last - first) or summary.duration / 1e6
  local per_second = seconds > 0 and total.answered / seconds or 0
  local complete = total.sent == total.buyers and total.answered == total.sent
    and #problems == 0
  local errors = summary.errors
  local ms = function(us)
    return us / 1000
  end
  local latency_ms = {
    p50 = ms(latency:percentile(50)),
    p90 = ms(latency:percentile(90)),
    p99 = ms(latency:percentile(99)),
    max = ms(latency.max),
  }

  io.write("\nseckill purchases\n")
  io.write(string.format("  buyers in file   %d, over %d threads\n", total.buyers, #threads))
  io.write(string.format("  sent             %d\n", total.sent))
  io.write(string.format("  answered         %d (202 %d, 409 %d, 410 %d, other %d)\n",
    total.answered, statuses["202"], statuses["409"], statuses["410"], statuses.other))
  local codes = {}
  for status in pairs(by_status) do
    table.insert(codes, status)
  end
  table.sort(codes)
  for _, status in ipairs(codes) do
    io.write(string.format("    %-6s %d\n", status, by_status[status]))
  end
  io.write(string.format("  unanswered       %d\n", total.sent - total.answered))
  io.write(string.format("  purchases/s      %.1f (answered over %.3f s, first sent to last answered)\n",
    per_second, seconds))
  io.write(string.format("  latency ms       p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
    latency_ms.p50, latency_ms.p90, latency_ms.p99, latency_ms.max))
  if total.filler_sent > 0 then
    io.write(string.format(
      "  filler           %d health checks after broken connections (in wrk's latency, not in the counts)\n",
      total.filler_sent))
  end
  io.write(string.format("  socket errors    connect %d, read %d, write %d, timeout %d\n",
    errors.connect, errors.read, errors.write, errors.timeout))
  for _, problem in ipairs(problems) do
    io.write("  PROBLEM          " .. problem .. "\n")
  end
  if not complete then
    io.write("  INCOMPLETE: not every buyer was sent once and answered (a PROBLEM above, or raise -d)\n")
  end

  -- Keys: buyers (tokens in the file), threads, sent, answered, unanswered, statuses
  -- ({"202","409","410","other"}), by_status (every code), filler_sent, seconds,
  -- purchases_per_sec, latency_ms ({p50,p90,p99,max}), socket_errors, complete, problems.
  io.write("SECKILL_WRK_REPORT " .. to_json({
    buyers = total.buyers,
    threads = #threads,
    threads_finished = total.threads_finished,
    sent = total.sent,
    answered = total.answered,
    unanswered = total.sent - total.answered,
    statuses = statuses,
    by_status = by_status,
    filler_sent = total.filler_sent,
    seconds = seconds,
    purchases_per_sec = per_second,
    latency_ms = latency_ms,
    socket_errors = {
      connect = errors.connect,
      read = errors.read,
      write = errors.write,
      timeout = errors.timeout,
    },
    complete = complete,
    problems = list(problems),
  }) .. "\n")
end
