// Arrow's headers need C++20 (std::span, std::bit_width): this file and arrow_values.cpp compile
// as C++20 (trainer_arrow_sources, cmake/Arrow.cmake). nlohmann/json's code paths are pinned to
// its C++17 ones, those of every other file, so that its inline functions are the same in every
// object file.
#define JSON_HAS_CPP_17
#define JSON_HAS_CPP_14
#define JSON_HAS_CPP_11
#define JSON_HAS_THREE_WAY_COMPARISON 0
#define JSON_HAS_RANGES 0

#include "data/formats/arrow_rows.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "data/formats/arrow_values.h"

namespace trainer::data {
namespace {

using Json = nlohmann::json;
using arrow_values::one_line;

[[noreturn]] void fail(const std::string& what) {
  throw ArrowRowsError(what);
}

template <typename T>
T value_or_fail(arrow::Result<T> result, const std::string& where) {
  if (!result.ok()) fail(where + ": " + one_line(result.status().ToString()));
  return std::move(result).ValueUnsafe();
}

void ok_or_fail(const arrow::Status& status, const std::string& where) {
  if (!status.ok()) fail(where + ": " + one_line(status.ToString()));
}

// The format of `path` from its first bytes; files of other formats are refused by name.
ArrowRows::Format detect_format(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    fail(path +
         ": a folder; name its files (a save_to_disk folder: data-*.arrow; the Hub's: "
         "*.parquet)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path + (std::filesystem::exists(path, ec) ? ": cannot be read" : ": no such file"));
  char bytes[8] = {};
  in.read(bytes, sizeof bytes);
  const std::string head(bytes, static_cast<size_t>(in.gcount()));
  if (head.empty()) fail(path + ": an empty file, neither Parquet nor an Arrow IPC stream");
  if (head.rfind("PAR1", 0) == 0) return ArrowRows::Format::parquet;
  if (head.rfind("ARROW1", 0) == 0) {
    fail(path +
         ": an Arrow IPC file (Feather v2), not an Arrow IPC stream; write it as a stream "
         "(pyarrow.ipc.new_stream, datasets' save_to_disk) or as Parquet (Dataset.to_parquet)");
  }
  if (head.rfind("FEA1", 0) == 0) {
    fail(path +
         ": a Feather v1 file, not an Arrow IPC stream; write it as Parquet "
         "(Dataset.to_parquet) or as an Arrow IPC stream (datasets' save_to_disk)");
  }
  if (head.size() >= 4 && std::memcmp(bytes, "\xff\xff\xff\xff", 4) == 0) {
    return ArrowRows::Format::arrow_stream;
  }
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".parquet") fail(path + ": not a Parquet file (it does not start with PAR1)");
  fail(path +
       ": neither Parquet nor an Arrow IPC stream (the files of a Hugging Face data set: "
       "*.parquet, or save_to_disk's data-*.arrow)");
}

// The Parquet leaf columns of a field, for reading it alone.
void add_leaves(const parquet::arrow::SchemaField& field, std::vector<int>& out) {
  if (field.is_leaf()) out.push_back(field.column_index);
  for (const auto& child : field.children) add_leaves(child, out);
}

}  // namespace

struct ArrowRows::Impl {
  std::string path;
  Format format = Format::parquet;
  std::shared_ptr<arrow::Schema> schema;  // the file's
  std::vector<std::string> file_columns, columns;
  std::vector<int> fields;      // the file's indices of `columns`, ascending
  std::vector<int64_t> starts;  // the first row of each row group (batch), then the row count

  // Parquet: the reader, the leaf columns of `columns`, the batches from the current row group.
  std::unique_ptr<parquet::arrow::FileReader> parquet;
  std::vector<int> leaves;
  std::unique_ptr<arrow::RecordBatchReader> batches;

  // An Arrow stream: the file and each record batch's message offset.
  std::shared_ptr<arrow::io::ReadableFile> file;
  std::vector<int64_t> offsets;
  arrow::ipc::IpcReadOptions ipc_options;
  size_t next_batch = 0;

  // The current batch, its columns in `columns` order, and the read position.
  std::shared_ptr<arrow::RecordBatch> batch;
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  int64_t batch_start = 0, batch_end = 0, index = 0, position = 0;

  void open_parquet();
  void open_stream();
  void select(const std::vector<std::string>& wanted);
  bool load_next();
  std::shared_ptr<arrow::RecordBatch> read_stream_batch(size_t b);
  void seek(int64_t row);
  bool at_row();
};

void ArrowRows::Impl::open_parquet() {
  parquet::ReaderProperties props(arrow::default_memory_pool());
  props.enable_buffered_stream();  // pages read as decoded, never a whole column chunk
  props.set_buffer_size(1 << 20);
  std::unique_ptr<parquet::ParquetFileReader> raw;
  try {
    raw = parquet::ParquetFileReader::OpenFile(path, false, props);
  } catch (const std::exception& e) {
    fail(path + ": not a Parquet file, or truncated (" + one_line(e.what()) + ")");
  }
  const auto meta = raw->metadata();
  int64_t bytes = 0;
  starts.push_back(0);
  for (int g = 0; g < meta->num_row_groups(); ++g) {
    const auto group = meta->RowGroup(g);
    bytes += group->total_byte_size();
    starts.push_back(starts.back() + group->num_rows());
  }
  // Batches of about 4 MB of decoded data: 4,096 rows of 1 KB, 128 token rows of 8,192 ids.
  const int64_t row_bytes = std::max<int64_t>(1, bytes / std::max<int64_t>(1, starts.back()));
  parquet::ArrowReaderProperties arrow_props;
  arrow_props.set_use_threads(false);
  arrow_props.set_pre_buffer(false);
  arrow_props.set_batch_size(std::clamp<int64_t>((4 << 20) / row_bytes, 1, 4096));
  try {
    parquet = value_or_fail(
        parquet::arrow::FileReader::Make(arrow::default_memory_pool(), std::move(raw), arrow_props),
        path + ": not a Parquet file Arrow reads");
    ok_or_fail(parquet->GetSchema(&schema), path + ": a Parquet schema Arrow does not read");
  } catch (const parquet::ParquetException& e) {
    fail(path + ": a Parquet schema Arrow does not read (" + one_line(e.what()) + ")");
  }
}

void ArrowRows::Impl::open_stream() {
  // The batch headers, read through a memory map: ReadRecordBatch of a mapped message refers to
  // its body without reading it.
  auto mapped = value_or_fail(arrow::io::MemoryMappedFile::Open(path, arrow::io::FileMode::READ),
                              path + ": cannot be read");
  auto messages = arrow::ipc::MessageReader::Open(mapped.get());
  arrow::ipc::DictionaryMemo memo;
  arrow::ipc::IpcReadOptions header_options;
  header_options.included_fields = {0};
  starts.push_back(0);
  for (;;) {
    const int64_t at = value_or_fail(mapped->Tell(), path);
    const std::string where = path + ": rows from " + std::to_string(starts.back()) + " (byte " +
                              std::to_string(at) + ")";
    auto message =
        value_or_fail(messages->ReadNextMessage(), where + ": truncated or corrupt Arrow stream");
    if (!message) break;
    switch (message->type()) {
      case arrow::ipc::MessageType::SCHEMA:
        if (schema) fail(where + ": a second schema in one Arrow stream");
        schema =
            value_or_fail(arrow::ipc::ReadSchema(*message, &memo), where + ": not an Arrow schema");
        break;
      case arrow::ipc::MessageType::DICTIONARY_BATCH:
        fail(path +
             ": dictionary-encoded columns are not read from Arrow streams; decode them "
             "(pyarrow: .dictionary_decode()) or write Parquet");
      case arrow::ipc::MessageType::RECORD_BATCH: {
        if (!schema) fail(where + ": a record batch before the schema");
        if (schema->num_fields() == 0) header_options.included_fields.clear();
        auto b = value_or_fail(arrow::ipc::ReadRecordBatch(*message, schema, &memo, header_options),
                               where + ": truncated or corrupt Arrow stream");
        offsets.push_back(at);
        starts.push_back(starts.back() + b->num_rows());
        break;
      }
      default:
        fail(where + ": not a schema or record batch message of an Arrow stream");
    }
  }
  if (!schema) fail(path + ": an Arrow stream without a schema (truncated?)");
  file = value_or_fail(arrow::io::ReadableFile::Open(path), path + ": cannot be read");
}

void ArrowRows::Impl::select(const std::vector<std::string>& wanted) {
  for (const auto& f : schema->fields()) file_columns.push_back(f->name());
  columns = wanted.empty() ? file_columns : wanted;
  for (const auto& name : columns) {
    const int i = schema->GetFieldIndex(name);
    if (i < 0) {
      std::string all;
      for (const auto& c : file_columns) all += (all.empty() ? "" : ", ") + c;
      fail(path + ": no column \"" + name + "\"" +
           (schema->GetAllFieldIndices(name).size() > 1 ? " (named twice)" : "") +
           " (the file's columns: " + all + ")");
    }
    fields.push_back(i);
  }
  std::sort(fields.begin(), fields.end());
  fields.erase(std::unique(fields.begin(), fields.end()), fields.end());
  if (format == Format::parquet) {
    for (const int f : fields) add_leaves(parquet->manifest().schema_fields[f], leaves);
  } else {
    ipc_options.included_fields = fields;
  }
}

std::shared_ptr<arrow::RecordBatch> ArrowRows::Impl::read_stream_batch(size_t b) {
  const std::string where =
      path + ": rows from " + std::to_string(starts[b]) + ": truncated or corrupt Arrow stream";
  ok_or_fail(file->Seek(offsets[b]), where);
  auto message = value_or_fail(arrow::ipc::ReadMessage(file.get()), where);
  if (!message) fail(where);
  return value_or_fail(arrow::ipc::ReadRecordBatch(*message, schema, nullptr, ipc_options), where);
}

bool ArrowRows::Impl::load_next() {
  std::shared_ptr<arrow::RecordBatch> b;
  if (format == Format::parquet) {
    if (!batches) return false;
    const std::string where =
        path + ": rows from " + std::to_string(batch_end) + ": truncated or corrupt Parquet data";
    try {
      ok_or_fail(batches->ReadNext(&b), where);
    } catch (const parquet::ParquetException& e) {
      fail(where + " (" + one_line(e.what()) + ")");
    }
  } else if (next_batch < offsets.size()) {
    b = read_stream_batch(next_batch++);
  }
  batch = b;
  arrays.clear();
  if (!b) return false;
  batch_start = batch_end;
  batch_end += b->num_rows();
  index = 0;
  for (const auto& name : columns) {
    const int i = b->schema()->GetFieldIndex(name);
    if (i < 0) fail(path + ": rows from " + std::to_string(batch_start) + ": no column " + name);
    arrays.push_back(b->column(i));
  }
  return true;
}

void ArrowRows::Impl::seek(int64_t row) {
  if (row < 0 || row > starts.back()) {
    fail(path + ": row " + std::to_string(row) + " is outside the file's " +
         std::to_string(starts.back()) + " rows");
  }
  batch.reset();
  arrays.clear();
  batches.reset();
  index = 0;
  position = row;
  if (row == starts.back()) {
    next_batch = offsets.size();
    return;
  }
  // The row group (batch) of `row`, then the rows before it within.
  const auto g =
      static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), row) - starts.begin() - 1);
  batch_end = starts[g];
  if (format == Format::parquet) {
    std::vector<int> groups;
    for (size_t k = g; k + 1 < starts.size(); ++k) groups.push_back(static_cast<int>(k));
    try {
      batches = value_or_fail(parquet->GetRecordBatchReader(groups, leaves), path);
    } catch (const parquet::ParquetException& e) {
      fail(path + ": " + one_line(e.what()));
    }
  } else {
    next_batch = g;
  }
  while (batch_end <= row) {
    if (!load_next()) {
      fail(path + ": ends before row " + std::to_string(row) + " of the " +
           std::to_string(starts.back()) + " its metadata counts (truncated or corrupt)");
    }
  }
  index = row - batch_start;
}

ArrowRows::ArrowRows(const std::string& path, const std::vector<std::string>& columns)
    : impl_(std::make_unique<Impl>()) {
  auto& d = *impl_;
  d.path = path;
  d.format = detect_format(path);
  if (d.format == Format::parquet) {
    d.open_parquet();
  } else {
    d.open_stream();
  }
  d.select(columns);
  d.seek(0);
}

ArrowRows::~ArrowRows() = default;
ArrowRows::ArrowRows(ArrowRows&&) noexcept = default;
ArrowRows& ArrowRows::operator=(ArrowRows&&) noexcept = default;

const std::string& ArrowRows::path() const {
  return impl_->path;
}
ArrowRows::Format ArrowRows::format() const {
  return impl_->format;
}
int64_t ArrowRows::num_rows() const {
  return impl_->starts.back();
}
const std::vector<std::string>& ArrowRows::file_columns() const {
  return impl_->file_columns;
}
const std::vector<std::string>& ArrowRows::columns() const {
  return impl_->columns;
}
int64_t ArrowRows::position() const {
  return impl_->position;
}
void ArrowRows::seek(int64_t row) {
  impl_->seek(row);
}

std::string ArrowRows::where(int64_t row) const {
  return impl_->path + ": row " + std::to_string(row);
}

bool ArrowRows::has_column(const std::string& column) const {
  return impl_->schema->GetFieldIndex(column) >= 0;
}

std::string ArrowRows::column_type(const std::string& column) const {
  const auto field = impl_->schema->GetFieldByName(column);
  return field ? field->type()->ToString() : "";
}

void ArrowRows::require(const std::string& column, ColumnKind kind) const {
  const auto& d = *impl_;
  const auto field = d.schema->GetFieldByName(column);
  if (!field) {
    std::string all;
    for (const auto& c : d.file_columns) all += (all.empty() ? "" : ", ") + c;
    fail(d.path + ": no column \"" + column + "\" (the file's columns: " + all + ")");
  }
  if (std::find(d.columns.begin(), d.columns.end(), column) == d.columns.end()) {
    fail(d.path + ": column \"" + column + "\" is not among the columns read");
  }
  if (!arrow_values::of_kind(*field->type(), kind)) {
    fail(d.path + ": column \"" + column + "\" is " + field->type()->ToString() + ", expected " +
         arrow_values::kind_text(kind));
  }
}

// Whether a row is left, with the batch holding it loaded.
bool ArrowRows::Impl::at_row() {
  while (!batch || index >= batch->num_rows()) {
    if (!load_next()) return false;
  }
  return true;
}

bool ArrowRows::next_integer_lists(std::vector<std::vector<int64_t>>& lists) {
  auto& d = *impl_;
  if (!d.at_row()) return false;
  lists.resize(d.columns.size());
  for (size_t c = 0; c < d.columns.size(); ++c) {
    try {
      arrow_values::integers_of(*d.arrays[c], d.index, lists[c]);
    } catch (const std::exception& e) {
      fail(where(d.position) + ", column \"" + d.columns[c] + "\": " + one_line(e.what()));
    }
  }
  ++d.index;
  ++d.position;
  return true;
}

bool ArrowRows::next(Json& row) {
  nlohmann::ordered_json ordered;
  if (!next(ordered)) return false;
  row = Json(ordered);
  return true;
}

bool ArrowRows::next(nlohmann::ordered_json& row) {
  auto& d = *impl_;
  if (!d.at_row()) return false;
  row = nlohmann::ordered_json::object();
  for (size_t c = 0; c < d.columns.size(); ++c) {
    try {
      arrow_values::to_json(*d.arrays[c], d.index, row[d.columns[c]]);
    } catch (const std::exception& e) {
      fail(where(d.position) + ", column \"" + d.columns[c] + "\": " + one_line(e.what()));
    }
  }
  ++d.index;
  ++d.position;
  return true;
}

}  // namespace trainer::data
