-- wrk: the writepath bench's CalDAV-shaped PUT, every name unique (thread, counter, random).
local counter = 0
local tid = 0
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function request()
  counter = counter + 1
  local path = string.format("/objects/%d/w%d-%d-%d", counter % 16, tid, counter, math.random(1000000000))
  return wrk.format("PUT", path, {["Content-Type"] = "application/json"}, '{"data":"object"}')
end
