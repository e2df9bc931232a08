-- Argo CD health check for dispatch.dev/DispatchJob.
-- Install it in argocd-cm as resource.customizations.health.dispatch.dev_DispatchJob (docs/gitops.md).
-- Tested by tests/unit/test_argocd_health.py against statuses the operator really writes.
--
--   Progressing  no status yet, the operator has not observed the latest generation
--                (status.observedGeneration < metadata.generation), or the job is pending,
--                running, recovering or ending its objects (Reconciling=True), as kstatus;
--   Healthy      Ready=True: the job succeeded and its objects are ended. If the operator
--                ever reports Ready=True while a job runs, running jobs become Healthy with
--                no change here;
--   Degraded     Stalled=True or Failed=True once nothing is reconciling: failed, cancelled,
--                or refused (a rule nobody can enforce, an invalid spec). The condition's
--                reason and message say which.
--
--   Suspended    a person suspended the job (spec.suspend: Ready=False with reason Suspended):
--                paused, and it continues once resumed, which is what Argo CD means by it.
--                A cancelled DispatchJob is Degraded, not Suspended: it never continues.
-- Only Lua's base library is used (Argo CD runs health checks without the standard libraries).

local health = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function say(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or fallback
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  health.status = "Progressing"
  health.message = "Deleting: ending the job's objects"
  return health
end

local status = obj.status
if status == nil or (status.conditions == nil and status.observedGeneration == nil) then
  health.status = "Progressing"
  health.message = "Waiting for the dispatch operator to plan the job"
  return health
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil then
  local observed = status.observedGeneration
  if observed == nil then
    local ready = condition(status, "Ready")
    observed = ready and ready.observedGeneration
  end
  if observed == nil or observed < generation then
    health.status = "Progressing"
    health.message = "Waiting for the dispatch operator to observe generation " .. tostring(generation)
    return health
  end
end

-- Checked first, as kstatus does: an outcome whose objects are still being ended is not final yet.
local reconciling = condition(status, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  health.status = "Progressing"
  health.message = say(reconciling, "Reconciling")
  return health
end

local stalled = condition(status, "Stalled")
local failed = condition(status, "Failed")
if stalled ~= nil and stalled.status == "True" then
  health.status = "Degraded"
  health.message = say(stalled, "Stalled")
  return health
end
if failed ~= nil and failed.status == "True" then
  health.status = "Degraded"
  health.message = say(failed, "Failed")
  return health
end

local ready = condition(status, "Ready")
if ready ~= nil and ready.status == "True" then
  health.status = "Healthy"
  health.message = say(ready, "Ready")
  return health
end

if ready ~= nil and ready.reason == "Suspended" then
  health.status = "Suspended"
  health.message = say(ready, "Suspended")
  return health
end

health.status = "Progressing"
health.message = say(ready, "Reconciling")
return health
