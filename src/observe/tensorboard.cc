#include "observe/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace myriad {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  return t;
}

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protobuf's wire format, the few pieces an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) out.push_back(static_cast<char>(v | 0x80)), v >>= 7;
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire) { varint(out, uint64_t(field) << 3 | uint64_t(wire)); }
void bytes_field(std::string& out, int field, const std::string& b) {
  tag(out, field, 2);
  varint(out, b.size());
  out += b;
}
template <class T>
void fixed_field(std::string& out, int field, T v) {  // double: wire 1, float: wire 5
  tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  out.append(raw, sizeof(T));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// field 3 (file version), 5 (summary) or 7 (session log): what the event holds.
std::string event(int64_t step, int field, const std::string& body) {
  std::string e;
  fixed_field(e, 1, now_s());
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  if (field) bytes_field(e, field, body);
  return e;
}

// A reader of one message's fields.
struct Fields {
  const std::string& b;
  size_t at = 0, end;
  const std::string& where;
  Fields(const std::string& buf, size_t begin, size_t stop, const std::string& w) : b(buf), at(begin), end(stop), where(w) {}
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= end) throw_runtime(where, ": a protobuf varint runs past its message");
      const uint8_t c = static_cast<uint8_t>(b[at++]);
      v |= uint64_t(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    throw_runtime(where, ": a protobuf varint is too long");
  }
  // Calls f(field, wire, begin, size) for each field; varints' values come as begin.
  template <class F>
  void each(F&& f) {
    while (at < end) {
      const uint64_t key = varint();
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      size_t n = 0;
      if (wire == 0) {
        f(field, wire, static_cast<size_t>(varint()), size_t(0));
        continue;
      }
      if (wire == 1) n = 8;
      else if (wire == 5) n = 4;
      else if (wire == 2) n = static_cast<size_t>(varint());
      else throw_runtime(where, ": protobuf wire type ", wire, " is not one an Event uses");
      if (at + n > end) throw_runtime(where, ": a protobuf field runs past its message");
      f(field, wire, at, n);
      at += n;
    }
  }
};

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  // TensorBoard reads a directory's files in name order: a file of a restart must sort after the
  // files before it, also within the same second.
  int64_t t = static_cast<int64_t>(now_s());
  const std::string prefix = "events.out.tfevents.";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) t = std::max<int64_t>(t, std::atoll(name.c_str() + prefix.size()) + 1);
  }
  path_ = (std::filesystem::path(dir) / cat(prefix, t, ".", host, ".", ::getpid())).string();
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw_runtime("tensorboard: cannot write ", path_, ": choose a writable --run-dir (or observe.tensorboard = false)");
  record(event(0, 3, "brain.Event:2"));
  record(event(first_step, 7, std::string("\x08\x01", 2)));  // SessionLog{status: START}
  std::fflush(f_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::record(const std::string& data) {
  const uint64_t n = data.size();
  char len[8];
  std::memcpy(len, &n, 8);  // little-endian on every machine Myriad builds for
  const uint32_t len_crc = masked_crc(len, 8), data_crc = masked_crc(data.data(), data.size());
  std::fwrite(len, 1, 8, f_);
  std::fwrite(&len_crc, 4, 1, f_);
  std::fwrite(data.data(), 1, data.size(), f_);
  std::fwrite(&data_crc, 4, 1, f_);
}

void TensorBoardWriter::write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [name, v] : scalars) {
    std::string value;
    bytes_field(value, 1, name);
    fixed_field(value, 2, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  record(event(step, 5, summary));
  std::fflush(f_);
}

std::vector<TensorBoardScalar> read_tensorboard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_runtime("tensorboard: cannot read ", path);
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TensorBoardScalar> out;
  for (size_t at = 0; at < b.size();) {
    const std::string where = cat(path, " at byte ", at);
    if (at + 12 > b.size()) throw_runtime(where, ": a truncated record header");
    uint64_t n = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&n, b.data() + at, 8);
    std::memcpy(&len_crc, b.data() + at + 8, 4);
    if (len_crc != masked_crc(b.data() + at, 8)) throw_runtime(where, ": the record length's checksum does not match");
    if (at + 12 + n + 4 > b.size()) throw_runtime(where, ": a truncated record");
    std::memcpy(&data_crc, b.data() + at + 12 + n, 4);
    if (data_crc != masked_crc(b.data() + at + 12, n)) throw_runtime(where, ": the record's checksum does not match");
    double wall = 0;
    int64_t step = 0;
    std::vector<std::pair<std::string, float>> values;
    Fields(b, at + 12, at + 12 + n, where).each([&](int field, int wire, size_t p, size_t len) {
      if (field == 1 && wire == 1) std::memcpy(&wall, b.data() + p, 8);
      if (field == 2 && wire == 0) step = static_cast<int64_t>(p);
      if (field != 5 || wire != 2) return;
      Fields(b, p, p + len, where).each([&](int f, int w, size_t vp, size_t vlen) {
        if (f != 1 || w != 2) return;
        std::pair<std::string, float> v;
        Fields(b, vp, vp + vlen, where).each([&](int g, int gw, size_t q, size_t qlen) {
          if (g == 1 && gw == 2) v.first = b.substr(q, qlen);
          if (g == 2 && gw == 5) std::memcpy(&v.second, b.data() + q, 4);
        });
        values.push_back(v);
      });
    });
    for (auto& [t, v] : values) out.push_back({wall, step, t, v});
    at += 12 + n + 4;
  }
  return out;
}

}  // namespace myriad
