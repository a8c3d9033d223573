// common/log.h — structured JSON-lines logging to stderr. Every line names the job, rank and
// generation when they are known, so logs of many ranks can be merged and filtered.
// Header-only (the engine uses it); depends on nlohmann/json only.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace tidal {

struct LogContext {
  std::string job;
  int rank = -1;
  int generation = 0;
};

class Logger {
 public:
  static Logger& Get() {
    static Logger logger;
    return logger;
  }
  void SetContext(LogContext context) {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = std::move(context);
  }
  LogContext context() {
    std::lock_guard<std::mutex> lock(mu_);
    return context_;
  }
  // Writes one JSON line: {"ts","level","msg","job","rank","generation", ...fields}.
  void Log(const char* level, const std::string& msg, const nlohmann::json& fields) {
    using namespace std::chrono;
    nlohmann::json line;
    line["ts"] = duration<double>(system_clock::now().time_since_epoch()).count();
    line["level"] = level;
    line["msg"] = msg;
    std::lock_guard<std::mutex> lock(mu_);
    if (!context_.job.empty()) line["job"] = context_.job;
    if (context_.rank >= 0) line["rank"] = context_.rank;
    line["generation"] = context_.generation;
    if (fields.is_object()) line.update(fields);
    std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    text.push_back('\n');
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }

 private:
  std::mutex mu_;
  LogContext context_;
};

inline void LogInfo(const std::string& msg,
                    const nlohmann::json& fields = nlohmann::json::object()) {
  Logger::Get().Log("info", msg, fields);
}
inline void LogWarn(const std::string& msg,
                    const nlohmann::json& fields = nlohmann::json::object()) {
  Logger::Get().Log("warn", msg, fields);
}
inline void LogError(const std::string& msg,
                     const nlohmann::json& fields = nlohmann::json::object()) {
  Logger::Get().Log("error", msg, fields);
}

}  // namespace tidal
