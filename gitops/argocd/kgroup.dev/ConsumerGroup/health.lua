-- Argo CD health of a kgroup.dev ConsumerGroup, read from the conditions its operator
-- writes (kstatus conventions: docs/operations.md, "GitOps health"):
--   status not written yet, or written for an older spec generation -> Progressing
--   Stalled=True (partitions stalled or unowned too long, or another problem) -> Degraded
--   SidecarMissing=True (labelled pods run without the sidecar and idle) -> Degraded
--   spec.paused -> Suspended
--   Reconciling=True (a rebalance under way) -> Progressing
--   Ready=True -> Healthy; otherwise Progressing (no member yet, partitions briefly unowned)
local hs = {}
local function answer(health, message)
  hs.status = health
  hs.message = message
  return hs
end
local status = obj.status
if status == nil or status.observedGeneration == nil then
  return answer("Progressing", "Waiting for the kgroup operator to write the status")
end
local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= generation then
  return answer("Progressing",
    "Waiting for the kgroup operator to observe generation " .. tostring(generation))
end
local conditions = {}
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    conditions[condition.type] = condition
  end
end
local function says(ctype, value)
  local condition = conditions[ctype]
  return condition ~= nil and condition.status == value
end
local function text(ctype)
  local condition = conditions[ctype]
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return condition.reason or ""
end
if says("Stalled", "True") then
  return answer("Degraded", text("Stalled"))
end
if says("SidecarMissing", "True") then
  return answer("Degraded", text("SidecarMissing"))
end
if obj.spec ~= nil and obj.spec.paused == true then
  return answer("Suspended",
    "ConsumerGroup is paused (spec.paused): its target assignment is frozen")
end
if says("Reconciling", "True") then
  return answer("Progressing", text("Reconciling"))
end
if says("Ready", "True") then
  return answer("Healthy", text("Ready"))
end
if conditions["Ready"] ~= nil then
  return answer("Progressing", text("Ready"))
end
return answer("Progressing", "Waiting for the Ready condition")
