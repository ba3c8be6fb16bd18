// Umbrella header: everything a training program needs.
#pragma once

#include "distckpt/async.h"
#include "distckpt/checkpoint.h"
#include "distckpt/comm.h"
#include "distckpt/config.h"
#include "distckpt/convert.h"
#include "distckpt/dtype.h"
#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/format.h"
#include "distckpt/gather.h"
#include "distckpt/inspect.h"
#include "distckpt/layout.h"
#include "distckpt/manager.h"
#include "distckpt/mpi_comm.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"
