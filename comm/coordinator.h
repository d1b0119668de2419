// Rendezvous through a coordinator: the Coordinator gRPC service that rank 0
// hosts and a standalone server for it, a Status-returning client, and the
// gloo::rendezvous::Store the Gloo communicator connects through. One
// header for the callers that use several of these.
#pragma once

#include "comm/coordinator_client.h"
#include "comm/coordinator_service.h"
#include "comm/coordinator_store.h"
