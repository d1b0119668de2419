// Sharding: the plan (which rank holds which rows and columns of every
// table), the bytes it puts on each rank, the greedy planner that makes one
// and the tier planner that moves tables between tiers to fit budgets. One
// header for the many callers that use several of these.
#pragma once

#include "embedding/sharding_memory.h"
#include "embedding/sharding_plan.h"
#include "embedding/sharding_planner.h"
#include "embedding/tier_planner.h"
