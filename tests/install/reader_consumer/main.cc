// Builds against the installed package with the reader component only.
// Every installed header is included with the project prefix (run.sh checks
// that this list matches what was installed). Writes a store with the Writer,
// reads a patch, prints "reader consumer ok".
#include <cstdio>

#include "patchstore/ingest/convert.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/ingest/ingest_volumes.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/ingest/volume_montage.h"
#include "patchstore/reader/order.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/reader/sat.h"
#include "patchstore/reader/slice_sampler.h"
#include "patchstore/reader/tensor_view.h"
#include "patchstore/reader/transform.h"
#include "patchstore/reader/verify.h"
#include "patchstore/reader/volume.h"
#include "patchstore/store/copy.h"
#include "patchstore/store/dtype.h"
#include "patchstore/store/format.h"
#include "patchstore/store/status.h"
#include "patchstore/store/store.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  patchstore::WriterOptions wo;
  wo.durable = false;
  auto w = patchstore::Writer::Open(argv[1], wo);
  if (!w.ok()) return 1;
  patchstore::FieldMeta f;
  f.name = "x";
  f.channels = 1;
  if (!(*w)->EnsureField(f).ok()) return 1;
  float data[16];
  for (int i = 0; i < 16; ++i) data[i] = static_cast<float>(i);
  patchstore::SampleInput s;
  s.id = "a";
  patchstore::RecordInput r;
  r.header.shape = {1, 4, 4, 0};
  r.data = data;
  s.records.push_back(r);
  if (!(*w)->WriteBatch({s}).ok() || !(*w)->Seal().ok()) return 1;
  w->reset();
  auto reader = patchstore::Reader::Open(argv[1]);
  if (!reader.ok()) return 1;
  auto p = (*reader)->Patch(0, 0, 1, 1, 2, 2);
  if (!p.ok() || p->data_as<float>()[0] != 5.0f) return 1;
  auto v = patchstore::VerifyStore(argv[1]);
  if (!v.ok()) return 1;
  std::printf("reader consumer ok\n");
  return 0;
}
