-- wrk: the writepath bench's CalDAV-shaped PUT, every name unique (thread, counter, random;
-- and the script's first argument, if given: `wrk ... -s put.lua URL -- p1`, for several wrk
-- processes writing one file at once).
local counter = 0
-- `tid` is a global: `thread:set` (in `setup`) sets the thread's own, which a `local` here would
-- hide (every thread's names would then be the same, and half the PUTs would update an object
-- another thread created).
tid = 0
local threads = 0
local prefix = ""
function init(args)
  if args[1] then prefix = args[1] end
end
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function request()
  counter = counter + 1
  local path = string.format("/objects/%d/%sw%d-%d-%d", counter % 16, prefix, tid, counter, math.random(1000000000))
  return wrk.format("PUT", path, {["Content-Type"] = "application/json"}, '{"data":"object"}')
end
